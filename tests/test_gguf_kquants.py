"""K-quants and the other block types: graphc's decoders against the `gguf` package's dequantizer.

Every type is decoded from random blocks and must give the same float32 values as
gguf.quants.dequantize (llama.cpp's reference in Python); kept types must also give them
through MLX's own dequantize of the packed layout the importer writes. A synthetic
Q4_K_M-style file (Q4_K with Q6_K for the embedding, v and down projections) must import
and give mlx-lm's logits on the file's dequantized weights; truncated and missing files
must be named in one line.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the test extra's `gguf` package is the reference")

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from gguf_blocks import LAYOUT, random_blocks  # noqa: E402
from gguf_writer import gguf_name, write_gguf  # noqa: E402

from graphc.compiler.gguf import GGUFError, import_gguf, resolve_model_path  # noqa: E402
from graphc.compiler.gguf.quants import KEPT_BITS, Affine, decode, pack  # noqa: E402

PROMPT = "Once upon a time, a small fox found a key under the old bridge."


@pytest.mark.parametrize("qtype", list(LAYOUT))
def test_decoder_equals_gguf_dequantize(qtype):
    rng = np.random.default_rng(hash(qtype) % 2**32)
    n = LAYOUT[qtype][0]
    rows, cols = 6, 2 * max(n, 256)
    raw = random_blocks(qtype, rows, cols, rng)
    ref = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, qtype)).astype(np.float32)
    got = decode(qtype, raw.reshape(-1), (rows, cols))
    if qtype in KEPT_BITS:
        assert isinstance(got, Affine) and got.bits == KEPT_BITS[qtype]
        # MLX computes with the layout written to disk: packed q, float32 scales and biases
        mlx_values = np.array(mx.dequantize(mx.array(pack(got.q, got.bits)), mx.array(got.scales),
                                            mx.array(got.biases), group_size=32, bits=got.bits))
        np.testing.assert_array_equal(mlx_values, ref)
        got = got.dequantize()
    else:
        assert isinstance(got, np.ndarray)
    # equal as values (d·(q−8) and d·q − 8d can differ only in the sign of a zero)
    np.testing.assert_array_equal(got, ref)
    assert np.abs(ref).max() > 0


def _q4_k_m(name: str) -> str:
    """llama.cpp's Q4_K_M recipe in small: Q6_K for the embedding, attn_v and ffn_down."""
    return "Q6_K" if any(k in name for k in ("embed_tokens", "v_proj", "down_proj", "lm_head")) else "Q4_K"


def _reference_folder(src_file, imported, out, arch=None):
    """An unquantized mlx-lm folder holding gguf's own dequantization of the file."""
    cfg = json.loads((imported / "config.json").read_text())
    for k in ("quantization", "quantization_config", "graphc_gguf"):
        cfg.pop(k, None)
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / f).write_bytes((imported / f).read_bytes())
    reader = gguf.GGUFReader(str(src_file))
    by_gguf = {t.name: t for t in reader.tensors}
    ours = mx.load(str(imported / "model.safetensors"))
    weights = {}
    for name in ours:
        if name.endswith((".scales", ".biases")):
            continue
        t = by_gguf[gguf_name(name, arch)]
        w = gguf.quants.dequantize(np.array(t.data), t.tensor_type).astype(np.float32)
        shape = tuple(int(d) for d in reversed(t.shape))
        w = w.reshape(shape)
        permuted = cfg["model_type"] in ("llama", "mixtral")  # llama.cpp permutes the llama family only
        if permuted and (".q_proj." in name or ".k_proj." in name):  # undone, as HF has it
            heads = cfg["num_attention_heads"] if ".q_proj." in name else cfg["num_key_value_heads"]
            w = w.reshape(heads, shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(shape)
        if ours[name].dtype != mx.uint32:  # a 1-D shared-expert gate is one row in mlx-lm
            w = w.reshape(ours[name].shape)
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):  # llama.cpp stored Gemma's norms +1
            w = w - 1
        weights[name] = mx.array(w)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    return out


@pytest.fixture(scope="module")
def big_llama(model_dir):
    # K-quant rows hold whole 256-value super-blocks: every input width a multiple of 256
    return model_dir("llama", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2, num_layers=2)


def test_q4_k_m_model_equals_mlx_lm_on_dequantized_weights(big_llama, tmp_path):
    f = tmp_path / "m-Q4_K_M.gguf"
    write_gguf(big_llama, f, _q4_k_m)
    logs = []
    out = import_gguf(f, tmp_path / "out", progress=logs.append, widen_dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"]["bits"] == 4 and cfg["quantization"]["group_size"] == 32
    types = cfg["graphc_gguf"]["types"]
    assert types["Q4_K"]["fate"] == "kept" and types["Q6_K"]["fate"] == "widened"
    assert any(line.strip().startswith("graphc:   Q6_K:") and "widened" in line for line in logs), logs
    assert any("Q4_K:" in line and "kept quantized" in line for line in logs), logs
    w = mx.load(str(out / "model.safetensors"))
    assert w["model.layers.0.self_attn.q_proj.weight"].dtype == mx.uint32
    assert w["model.layers.0.self_attn.q_proj.scales"].dtype == mx.float32  # d·sc is no float16
    assert w["model.layers.0.mlp.down_proj.weight"].dtype == mx.float32
    ref = _reference_folder(f, out, tmp_path / "ref")
    model, tok = mlx_lm.load(str(out))
    ref_model, _ = mlx_lm.load(str(ref))
    ids = tok.encode(PROMPT)
    a = np.array(model(mx.array([ids]))[0])
    b = np.array(ref_model(mx.array([ids]))[0])
    np.testing.assert_allclose(a, b, atol=1e-4 * np.abs(b).max(), rtol=1e-4)
    # default: the widened tensors in float16 (half the memory), logits still close
    out16 = import_gguf(f, tmp_path / "out16")
    assert mx.load(str(out16 / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"].dtype == mx.float16
    c = np.array(mlx_lm.load(str(out16))[0](mx.array([ids]))[0].astype(mx.float32))
    assert np.corrcoef(c.ravel(), b.ravel())[0, 1] > 0.9999


@pytest.mark.parametrize("qtype", ["Q5_K", "Q5_0", "Q5_1", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS"])
def test_other_types_import(big_llama, tmp_path, qtype):
    f = tmp_path / f"m-{qtype}.gguf"
    write_gguf(big_llama, f, qtype)
    out = import_gguf(f, tmp_path / "out", widen_dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    fate = cfg["graphc_gguf"]["types"][qtype]["fate"]
    assert fate == ("kept" if qtype in KEPT_BITS else "widened")
    if fate == "kept":
        assert cfg["quantization"]["bits"] == KEPT_BITS[qtype]
    ref = _reference_folder(f, out, tmp_path / "ref")
    model, tok = mlx_lm.load(str(out))
    ids = tok.encode(PROMPT)
    a = np.array(model(mx.array([ids]))[0])
    b = np.array(mlx_lm.load(str(ref))[0](mx.array([ids]))[0])
    # Q4_0/Q5_x/Q8_0 scales are exact float16, so they are stored (and MLX computes) in float16
    exact16 = mx.load(str(out / "model.safetensors")).get("model.embed_tokens.scales", mx.zeros(1)).dtype == mx.float16
    tol = 2e-2 if exact16 else 1e-4
    np.testing.assert_allclose(a.astype(np.float32), b, atol=tol * np.abs(b).max(), rtol=tol)


def test_truncated_and_missing_files_are_one_line_errors(big_llama, tmp_path, capsys):
    from graphc.cli import main

    f = tmp_path / "whole.gguf"
    write_gguf(big_llama, f, _q4_k_m)
    cut = tmp_path / "cut.gguf"
    data = f.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(GGUFError, match="ends inside its tensor data"):
        import_gguf(cut, tmp_path / "o")
    assert main(["import-gguf", str(cut), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "ends inside its tensor data" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(GGUFError, match="does not exist"):
        resolve_model_path(missing)
    assert main(["generate", "--model", str(missing), "hello"]) == 2
    err = capsys.readouterr().err
    assert "nowhere.gguf' does not exist" in err and "config.json" not in err


def test_inspect_reports_kept_and_widened(big_llama, tmp_path, monkeypatch, capsys):
    from graphc.cli import main

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "m-Q4_K_M.gguf"
    write_gguf(big_llama, f, _q4_k_m)
    assert main(["inspect", "auto", "--model", str(f)]) == 0
    err = capsys.readouterr().err
    q4 = next(line for line in err.splitlines() if line.startswith("gguf:   Q4_K:"))
    q6 = next(line for line in err.splitlines() if line.startswith("gguf:   Q6_K:"))
    assert "kept quantized" in q4 and "4.50 -> 6.00 bits/weight" in q4  # float32 scale + bias per 32
    assert "widened" in q6 and "6.56 -> 16.00 bits/weight" in q6
