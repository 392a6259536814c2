r"""graphc's GGUF tokenizers against Hugging Face transformers' own GGUF tokenizer conversion.

transformers builds a `tokenizers` tokenizer from the same `tokenizer.ggml.*` metadata
(`transformers.integrations.gguf.gguf_tokenizer_mapping`). Both must give the same ids,
and decode them the same way, over a few hundred strings: unicode, emoji, whitespace
runs, digits, contractions, and the vocabulary's own control tokens inside text. Checked
for a SentencePiece vocabulary trained here, byte-level BPE vocabularies under every
pre-tokenizer graphc accepts, and the real SmolLM2 (BPE) and Gemma 3 (SentencePiece)
files when present.

Two of transformers' conversions differ from llama.cpp; graphc follows llama.cpp, and
the test checks it there against an independent reference instead:
- SentencePiece (`llama` model): llama.cpp (llama-vocab.cpp, `is_prev_special`) cuts the
  vocabulary's control and user-defined tokens out of the raw text, prefixes ▁ to every
  text fragment that starts the text or follows such a token, and tokenizes each fragment
  alone. transformers' Metaspace prefixes ▁ only at the very start, and not even there
  when the text already starts with a space (" a" -> ▁a, where sentencepiece and llama.cpp
  give ▁▁ a); it also matches user-defined tokens in the *normalized* text, so Gemma's
  whitespace tokens ("  ") catch a literal "▁▁". Those strings are checked against
  llama.cpp's fragment rule run here over transformers' own BPE model (and, for the
  vocabulary trained here, against `sentencepiece` too where no special token is spelled).
- `smollm` / `starcoder` byte-level BPE: transformers has no split for these pre-types and
  falls back to GPT-2's; llama.cpp (llama-vocab.cpp) first splits every digit (\p{N}), then
  GPT-2's regex. Those strings are checked against llama.cpp's two regexes, run here.

transformers 5's GGUF *file reader* imports torch (for tensor dtypes), which the test
extra does not install; the tokenizer conversion does not. So the metadata is read with
the `gguf` package and grouped exactly as `get_gguf_tokenizer` groups it, and handed to
transformers' `convert_gguf_tokenizer`.
"""

from __future__ import annotations

import random

import pytest
import regex

gguf = pytest.importorskip("gguf", reason="the test extra's `gguf` package reads and writes the files")
tm = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping",
                         reason="transformers >= 5 converts GGUF tokenizers in this module")

from gguf_writer import write_gguf  # noqa: E402
from real_model import smollm2_gguf  # noqa: E402
from test_gguf_real_kquant import _path as gemma3_gguf  # noqa: E402
from test_gguf_sentencepiece import _spm_metadata, sp_model  # noqa: E402, F401  (sp_model: a fixture)
from tokenizers import pre_tokenizers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from graphc.compiler.gguf import import_gguf  # noqa: E402

PIECES = ["fox", " the", "The", "  ", "   ", "\t", "\n", "\r\n", "123", "4567", "3.14", "é", "ü", "日本", "中文",
          "🦊", "👍🏽", "✓", "Ω", "\u00a0", "\u200b", "über", "Ça", "don't", "I'll", "we're", "code", "x*2",
          " ", "ab", "zq", "ﬁ", "𝔘", "-", "...", "<", ">", "▁", "Ġ", "a", "ключ", "مرحبا", "\\n", "{}", "()"]


def _strings(specials: list[str], n: int = 300) -> list[str]:
    rng = random.Random(1)
    out = ["", " ", "  ", "a", " a", "a ", "\n\n\n", "Hello world", " leading space", "trailing space ",
           "tabs\tand\nnew lines\n", "日本語のテキスト。", "🦊🦊🦊", "ünïcödé ✓"]
    out += [f"{s}hi" for s in specials] + [f"say {s} twice {s}" for s in specials]
    while len(out) < n:
        parts = [rng.choice(PIECES) for _ in range(rng.randint(1, 14))]
        if specials and rng.random() < 0.2:
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(specials))
        out.append("".join(parts))
    return out


def transformers_tokenizer(path):
    """(tokenizers.Tokenizer, add_bos_token) as transformers converts this GGUF file's tokenizer."""
    reader = gguf.GGUFReader(str(path))
    md = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.") or k == "general.architecture"}
    grouped = {group: {name: md[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in md}
               for group, renames in tm.GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":  # as get_gguf_tokenizer: llama.cpp's default for SPM
        config.setdefault("add_bos_token", True)
    backend, _ = tm.convert_gguf_tokenizer(md["general.architecture"], tokenizer)
    return backend, bool(config.get("add_bos_token", False)), md


def _controls(md) -> list[str]:
    tokens, types = md["tokenizer.ggml.tokens"], md.get("tokenizer.ggml.token_type", [])
    return [tokens[i] for i, t in enumerate(types) if t == 3 and tokens[i]][:12]  # CONTROL tokens


# llama.cpp's regexes for the `smollm` / `starcoder` pre-tokenizers, applied in turn
LLAMA_CPP_DIGIT_SPLIT = [r"\p{N}", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"]


def llama_cpp_digit_split(backend, text: str, specials: dict[str, int]) -> list[int]:
    """Byte-level BPE ids as llama.cpp's smollm/starcoder pre-tokenizer splits `text`; control
    tokens spelled in the text are cut out first and stay one id each, as llama.cpp does."""
    if specials:
        cut = regex.split("(" + "|".join(regex.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")", text)
        return [i for part in cut if part
                for i in ([specials[part]] if part in specials else llama_cpp_digit_split(backend, part, {}))]
    pieces = [text]
    for pattern in LLAMA_CPP_DIGIT_SPLIT:  # each regex splits every piece, keeping the unmatched runs
        out = []
        for piece in pieces:
            pos = 0
            for m in regex.finditer(pattern, piece):
                out += [piece[pos:m.start()], m.group()] if m.start() > pos else [m.group()]
                pos = m.end()
            out += [piece[pos:]] if pos < len(piece) else []
        pieces = out
    to_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return [t.id for piece in pieces for mapped, _ in to_bytes.pre_tokenize_str(piece)
            for t in backend.model.tokenize(mapped)]


def _cut(text: str, specials: dict[str, int]) -> list[str]:
    """`text` split around the special tokens it spells (longest first), as llama.cpp's st_partition."""
    if not specials:
        return [text]
    alternatives = "|".join(regex.escape(t) for t in sorted(specials, key=len, reverse=True))
    return [part for part in regex.split(f"({alternatives})", text) if part]


def llama_cpp_spm(backend, text: str, specials: dict[str, int], add_space_prefix: bool) -> list[int]:
    """SentencePiece ids by llama.cpp's rule: ▁ before the text and after each special token."""
    ids, prev_special = [], True
    for part in _cut(text, specials):
        if part in specials:
            ids.append(specials[part])
            prev_special = True
            continue
        fragment = ((" " if add_space_prefix and prev_special else "") + part).replace(" ", "\u2581")
        ids += [t.id for t in backend.model.tokenize(fragment)]
        prev_special = False
    return ids


def compare(gguf_file, out, n=300, sp=None):
    """Encode and decode `n` strings with graphc and transformers; returns the strings where
    transformers' known divergence (module docstring) applied and graphc matched the reference."""
    backend, add_bos, md = transformers_tokenizer(gguf_file)
    ours = AutoTokenizer.from_pretrained(str(import_gguf(gguf_file, out)))
    bos = md.get("tokenizer.ggml.bos_token_id")
    model, pre = md["tokenizer.ggml.model"], md.get("tokenizer.ggml.pre")
    strings = _strings(_controls(md), n)
    tokens, types = md["tokenizer.ggml.tokens"], md.get("tokenizer.ggml.token_type", [])
    specials = {tokens[i]: i for i, t in enumerate(types) if t in (3, 4) and tokens[i]}  # control, user-defined
    diverged = []
    for text in strings:
        want = backend.encode(text, add_special_tokens=False).ids
        got = ours.encode(text, add_special_tokens=False)
        if got != want and model == "llama":
            want = llama_cpp_spm(backend, text, specials, bool(md.get("tokenizer.ggml.add_space_prefix", True)))
            if sp is not None and not any(t in text for t in specials):
                assert want == sp.encode(text), text  # the rule is sentencepiece's own, where it applies
            if got != want and "\u2581" in text and any(" " in t for t in specials):
                # Gemma's whitespace tokens: the file spells them with spaces, llama.cpp matches
                # them against spaces only, transformers' vocabulary respells them with ▁ (and so
                # does its BPE model used above). No reference here: graphc must round-trip
                # (▁ decodes to a space in SentencePiece, for llama.cpp as for everyone).
                assert ours.decode(got) == text.replace("\u2581", " "), text
                want = got
            diverged.append(text)
        elif got != want and pre in ("smollm", "starcoder"):
            want = llama_cpp_digit_split(backend, text, specials)
            diverged.append(text)
        assert got == want, (text, got, want)
        assert ours.encode(text) == ([bos] if add_bos else []) + got, text
        assert ours.decode(got) == backend.decode(got, skip_special_tokens=False), text
    return strings, diverged


def test_sentencepiece_vocabulary_equals_transformers(sp_model, model_dir, tmp_path):  # noqa: F811
    src = model_dir("llama", vocab_size=sp_model.get_piece_size())
    f = tmp_path / "spm.gguf"
    write_gguf(src, f, "F32", tokenizer=_spm_metadata(sp_model))
    strings, diverged = compare(f, tmp_path / "out", sp=sp_model)
    specials = ("<s>", "</s>", "<|tool|>")
    assert len(strings) >= 300 and diverged
    assert all(t.startswith((" ", "\u2581")) or any(s in t for s in specials) for t in diverged)


@pytest.mark.parametrize("pre", ["default", "gpt-2", "smollm", "starcoder", "llama-bpe", "qwen2"])
def test_byte_level_bpe_equals_transformers(model_dir, tmp_path, pre):
    f = tmp_path / "bpe.gguf"
    write_gguf(model_dir("llama"), f, "F32", pre=pre)
    strings, diverged = compare(f, tmp_path / "out")
    assert len(strings) >= 300
    assert all(regex.search(r"\p{N}", t) for t in diverged) and (bool(diverged) or pre not in ("smollm", "starcoder"))


def test_real_smollm2_tokenizer_equals_transformers(tmp_path):
    path, why = smollm2_gguf()
    if path is None:
        pytest.skip(why)
    strings, diverged = compare(path, tmp_path / "out", n=500)
    assert len(strings) >= 500 and all(regex.search(r"\p{N}", t) for t in diverged)


def test_real_gemma3_tokenizer_equals_transformers(tmp_path):
    strings, diverged = compare(gemma3_gguf(), tmp_path / "out", n=500)
    # Gemma adds no ▁ prefix: only its whitespace tokens against a literal ▁ differ
    assert len(strings) >= 500 and all("\u2581" in t for t in diverged)
