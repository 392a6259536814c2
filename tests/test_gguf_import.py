"""GGUF import: synthetic files written by llama.cpp's own `gguf` writer, round-tripped.

Each supported tensor type is written from a tiny random-weight model, imported, loaded
through mlx_lm.load, and compared against the source weights (dequantized, with a
tolerance per type) and against the gguf package's own dequantization. The F32 import
must give the source model's logits exactly (this is what checks the q/k un-permutation
end to end); the tokenizer must encode and decode like the source tokenizer.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the test extra's `gguf` package writes the synthetic files")

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from gguf_writer import write_gguf  # noqa: E402

from graphc.compiler.gguf import GGUFError, import_gguf, read_header, resolve_model_path  # noqa: E402

# Worst |dequantized - source| relative to the largest |value| in the tensor.
TOLERANCE = {"F32": 0.0, "F16": 1e-3, "Q8_0": 1e-2, "Q4_1": 0.08, "Q4_0": 0.15}
PROMPT = "Once upon a time, a small fox found a key under the old bridge."


def _params(model_dir):
    model, tok = mlx_lm.load(str(model_dir))
    out = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "scales"):  # quantized: compare what the layer computes with
            out[f"{name}.weight"] = np.array(mx.dequantize(mod.weight, mod.scales, mod.biases,
                                                           group_size=mod.group_size, bits=mod.bits))
    from mlx.utils import tree_flatten

    for name, p in tree_flatten(model.parameters()):
        if name.endswith((".scales", ".biases")) or name in out:
            continue
        if p.dtype != mx.uint32:
            out[name] = np.array(p.astype(mx.float32))
    return model, tok, out


def _logits(model, ids):
    return np.array(model(mx.array([ids]))[0].astype(mx.float32))


@pytest.fixture(scope="module")
def llama(model_dir):
    return model_dir("llama")


@pytest.mark.parametrize("qtype", list(TOLERANCE))
def test_each_type_round_trips(llama, tmp_path, qtype):
    src_file = tmp_path / f"m-{qtype}.gguf"
    source = write_gguf(llama, src_file, qtype)
    out = import_gguf(src_file, tmp_path / "out")
    cfg = json.loads((out / "config.json").read_text())
    if qtype.startswith("Q"):
        bits = 8 if qtype == "Q8_0" else 4
        assert cfg["quantization"]["bits"] == bits and cfg["quantization"]["group_size"] == 32
    else:
        assert "quantization" not in cfg
    model, tok, params = _params(out)
    assert set(params) == set(source), set(params) ^ set(source)
    # The gguf package's own dequantization of what it wrote: the import keeps it (f16 scales).
    reader = gguf.GGUFReader(str(src_file))
    theirs = {t.name: gguf.quants.dequantize(np.array(t.data), t.tensor_type) for t in reader.tensors}
    from gguf_writer import gguf_name, permute

    for name, want in source.items():
        got = params[name]
        scale = np.abs(want).max()
        err = np.abs(got - want).max() / scale
        assert err <= TOLERANCE[qtype] + 1e-7, f"{qtype} {name}: relative error {err:.4f}"
        ref = theirs[gguf_name(name)].reshape(want.shape)
        if ".q_proj." in name or ".k_proj." in name:  # the file holds them permuted; undo for comparison
            heads = cfg["num_attention_heads"] if ".q_proj." in name else cfg["num_key_value_heads"]
            half = want.shape[0] // heads // 2
            ref = ref.reshape(heads, half, 2, -1).swapaxes(1, 2).reshape(want.shape)
            # a permuted source compared unpermuted would be far off: the check has teeth
            assert np.abs(permute(want, heads) - want).max() > 0
        np.testing.assert_allclose(got, ref, atol=2e-3 * scale, rtol=0)
    ids = tok.encode(PROMPT)
    ref_model, _ = mlx_lm.load(str(llama))
    a, b = _logits(model, ids), _logits(ref_model, ids)
    if qtype == "F32":
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    else:
        corr = np.corrcoef(a.ravel(), b.ravel())[0, 1]
        assert corr > {"F16": 0.9999, "Q8_0": 0.999, "Q4_1": 0.95, "Q4_0": 0.9}[qtype], corr


def test_untied_head_and_qwen3(model_dir, tmp_path):
    for arch, kw in (("llama", {"tie_word_embeddings": False}), ("qwen3", {})):
        src = model_dir(arch, **kw)
        f = tmp_path / f"{arch}.gguf"
        write_gguf(src, f, "F32")
        out = import_gguf(f, tmp_path / f"out-{arch}")
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["model_type"] == arch
        assert cfg["tie_word_embeddings"] == (arch == "qwen3")
        m, tok = mlx_lm.load(str(out))
        ref, _ = mlx_lm.load(str(src))
        ids = tok.encode(PROMPT)
        np.testing.assert_allclose(_logits(m, ids), _logits(ref, ids), atol=1e-4, rtol=1e-4)


def test_tokenizer_matches_source_and_metadata(llama, tmp_path):
    f = tmp_path / "m.gguf"
    write_gguf(llama, f, "F16")
    out = import_gguf(f, tmp_path / "out")
    _, tok = mlx_lm.load(str(out))
    _, ref = mlx_lm.load(str(llama))
    md = read_header(f).metadata
    tokens = md["tokenizer.ggml.tokens"]
    texts = [PROMPT, "Numbers 12345 and   spaces\n\nnew lines, ünïcödé ✓ 🦊",
             "<|im_start|>user\nhi<|im_end|>\n"]
    for text in texts:
        ids = tok.encode(text)
        assert ids == ref.encode(text)
        assert tok.decode(ids) == text
    # every vocabulary entry decodes to the bytes its GGUF token string stands for
    from tokenizers import decoders

    byte_level = decoders.ByteLevel()
    for i in range(0, len(tokens), 7):
        assert tok.decode([i]) == byte_level.decode([tokens[i]])
    # specials: single ids, EOS and the chat template carried over
    assert tok.encode("<|im_end|>") == [md["tokenizer.ggml.eos_token_id"]]
    assert md["tokenizer.ggml.eos_token_id"] in tok.eos_token_ids
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                     tokenize=False)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_refusals_name_what_is_unsupported(llama, tmp_path):
    f = tmp_path / "k.gguf"
    write_gguf(llama, f, "F16", extra_tensors={"blk.0.extra.weight": (np.zeros((4, 66), np.uint8), "IQ2_XXS")})
    with pytest.raises(GGUFError, match="IQ2_XXS"):
        import_gguf(f, tmp_path / "o1")
    f2 = tmp_path / "a.gguf"
    write_gguf(llama, f2, "F16", arch="gpt2")
    with pytest.raises(GGUFError, match="architecture 'gpt2' is not supported"):
        import_gguf(f2, tmp_path / "o2")
    f3 = tmp_path / "t.gguf"
    write_gguf(llama, f3, "F16", tokenizer_model="t5")
    with pytest.raises(GGUFError, match="tokenizer model 't5'"):
        import_gguf(f3, tmp_path / "o3")
    f3b = tmp_path / "t2.gguf"
    write_gguf(llama, f3b, "F16", tokenizer_model="llama")  # SentencePiece without its scores
    with pytest.raises(GGUFError, match="needs tokenizer.ggml.scores"):
        import_gguf(f3b, tmp_path / "o3b")
    f4 = tmp_path / "p.gguf"
    write_gguf(llama, f4, "F16", pre="some-new-regex")
    with pytest.raises(GGUFError, match="pre-tokenizer 'some-new-regex'"):
        import_gguf(f4, tmp_path / "o4")
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        import_gguf(not_gguf, tmp_path / "o5")


def test_engine_and_cli_take_a_gguf_path(llama, tmp_path, monkeypatch, capsys):
    from graphc.cli import main
    from graphc.runtime import Engine, SamplingParams

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "tiny.gguf"
    write_gguf(llama, f, "F32")
    folder = resolve_model_path(f)
    assert folder.parent == tmp_path / "cache" / "gguf" and (folder / "config.json").exists()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(f) == folder  # converted once
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    params = SamplingParams(max_tokens=8, temperature=0.0)
    ours = Engine.load(f).generate([PROMPT], params)[0]
    ref = Engine.load(llama).generate([PROMPT], params)[0]
    assert ours.token_ids == ref.token_ids
    assert main(["import-gguf", str(f), "--out", str(tmp_path / "cli-out")]) == 0
    assert (tmp_path / "cli-out" / "tokenizer.json").exists()
    assert main(["import-gguf", str(f), "--out", str(tmp_path / "cli-out")]) == 2  # not empty: refused
    assert "not empty" in capsys.readouterr().err
