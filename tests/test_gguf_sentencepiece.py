"""GGUF SentencePiece vocabularies (`tokenizer.ggml.model == "llama"`) against SentencePiece itself.

A small SentencePiece BPE model is trained here with Llama 2's settings (byte fallback,
digits split, no normalization, whitespace kept); its pieces, scores and types go into a
GGUF file as llama.cpp's converter writes them; the imported tokenizer must encode a few
hundred strings (unicode, whitespace runs, digits, bytes outside the vocabulary; no special-token text,
which SentencePiece reads as plain characters and llama.cpp and Hugging Face as one token) to the
same ids as `sentencepiece` and decode them back, keep control tokens as single ids, and
carry the chat template.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the test extra's `gguf` package writes the synthetic files")
spm = pytest.importorskip("sentencepiece", reason="the test extra's `sentencepiece` is the reference")

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from gguf_writer import write_gguf  # noqa: E402

from graphc.compiler.gguf import import_gguf  # noqa: E402

CORPUS = [
    "Once upon a time, a small fox found a key under the old bridge.",
    "The quick brown fox jumps over the lazy dog; 1234567890 times!",
    "Le renard brun saute par-dessus le chien paresseux. Ça va très bien, merci.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München.",
    "  leading spaces, trailing spaces   and\ttabs\nand new lines\n\n",
    "def main():\n    return [x * 2 for x in range(10)]  # code too",
    "日本語のテキストも少し。中文也有一点。",
]
TEMPLATE = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    (d / "corpus.txt").write_text("\n".join(CORPUS * 30))
    spm.SentencePieceTrainer.train(
        input=str(d / "corpus.txt"), model_prefix=str(d / "m"), vocab_size=400, model_type="bpe",
        byte_fallback=True, split_digits=True, allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", character_coverage=1.0,
        user_defined_symbols=["<|tool|>"], minloglevel=2)
    return spm.SentencePieceProcessor(model_file=str(d / "m.model"))


def _spm_metadata(sp):
    def write(w):
        n = sp.get_piece_size()
        types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                 else 5 if sp.is_unused(i) else 4 if sp.id_to_piece(i) == "<|tool|>" else 1 for i in range(n)]
        w.add_string("tokenizer.ggml.model", "llama")
        w.add_array("tokenizer.ggml.tokens", [sp.id_to_piece(i) for i in range(n)])
        w.add_array("tokenizer.ggml.scores", [float(sp.get_score(i)) for i in range(n)])
        w.add_array("tokenizer.ggml.token_type", types)
        w.add_uint32("tokenizer.ggml.bos_token_id", sp.bos_id())
        w.add_uint32("tokenizer.ggml.eos_token_id", sp.eos_id())
        w.add_uint32("tokenizer.ggml.unknown_token_id", sp.unk_id())
        w.add_bool("tokenizer.ggml.add_bos_token", True)
        w.add_string("tokenizer.chat_template", TEMPLATE)
    return write


def _strings(n=300):
    rng = random.Random(0)
    pieces = ["fox", " the", "  ", "\t", "\n", "123", "4567", "é", "ü", "日本", "🦊", "✓", "Ω", "\u00a0",
              "über", "Ça", "code", "x*2", " ", "ab", "zq", "ﬁ", "𝔘", "-", "...", "<", ">", "▁"]
    out = list(CORPUS) + ["", " ", "   ", "a", " a", "a ", "\n\n\n", "🦊🦊", "ünïcödé ✓"]
    while len(out) < n:
        out.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))))
    return out


def test_sentencepiece_round_trips_like_sentencepiece(sp_model, model_dir, tmp_path):
    src = model_dir("llama", vocab_size=sp_model.get_piece_size())
    f = tmp_path / "spm.gguf"
    write_gguf(src, f, "F32", tokenizer=_spm_metadata(sp_model))
    out = import_gguf(f, tmp_path / "out")
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["add_bos_token"] is True and cfg["chat_template"] == TEMPLATE
    model, tok = mlx_lm.load(str(out))
    bos = sp_model.bos_id()
    byte_fallbacks = 0
    for text in _strings():
        want = [bos] + sp_model.encode(text)
        got = tok.encode(text)
        assert got == want, (text, got, want)
        assert tok.decode(got, skip_special_tokens=True) == sp_model.decode(want[1:]), text
        byte_fallbacks += any(sp_model.is_byte(i) for i in want)
    assert byte_fallbacks > 10  # the strings do reach the <0xXX> fallback
    # control tokens stay single ids; the user-defined one too
    assert tok.encode("</s>", add_special_tokens=False) == [sp_model.eos_id()]
    assert tok.encode("hi<|tool|>", add_special_tokens=False)[-1] == sp_model.piece_to_id("<|tool|>")
    assert sp_model.eos_id() in tok.eos_token_ids
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert prompt == "[INST] hi [/INST]"
    logits = model(mx.array([tok.encode(CORPUS[0])]))
    assert np.isfinite(np.array(logits)).all()
