"""GGUF `deepseek2` (DeepSeek-V2 and, sigmoid-routed, V3) against mlx-lm's deepseek_v2 / deepseek_v3.

Each source is an mlx-lm model class with random weights (tiny: MLA with q and kv LoRA,
a dense first layer, routed + shared experts, YaRN RoPE; V3 with grouped sigmoid routing
and the expert score bias). The `gguf` package writes it as llama.cpp's converter does:
MLA metadata (head_count_kv 1, key_length = kv_lora_rank + rope, the *_mla keys) and
kv_b split into attn_k_b (transposed) + attn_v_b, or, like files from before 2025, one
attn_kv_b. F32 files must give the source's logits; Q4_K_M-style files (Q4_K + Q6_K, the
64-wide attn_k_b rows falling back to Q5_0/Q8_0 as llama.cpp does) must give mlx-lm's
logits on the weights `gguf` itself dequantizes, rebuilt here independently; graphc's
engine must serve them with mlx-lm's greedy tokens.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the test extra's `gguf` package writes the synthetic files")

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from gguf_writer import gguf_name, write_gguf  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402
from test_gguf_kquants import _q4_k_m  # noqa: E402

from graphc.compiler.gguf import GGUFError, import_gguf, summary_lines  # noqa: E402

PROMPT = "Once upon a time, a small fox found a key under the old bridge."
MLA = {"hidden_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
       "intermediate_size": 512, "moe_intermediate_size": 256, "kv_lora_rank": 256, "q_lora_rank": 256,
       "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 64, "n_routed_experts": 4,
       "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
       "routed_scaling_factor": 1.5, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
       "max_position_embeddings": 512, "tie_word_embeddings": False}
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32.0, "beta_slow": 1.0}
CONFIGS = {
    "deepseek_v2": dict(MLA, model_type="deepseek_v2", topk_method="group_limited_greedy", n_group=2, topk_group=1,
                        rope_scaling=dict(YARN, mscale=0.707, mscale_all_dim=0.707)),
    # V2-Lite's shape: no q LoRA (a plain attn_q), greedy routing over all experts
    "deepseek_v2_lite": dict(MLA, model_type="deepseek_v2", q_lora_rank=None, topk_method="greedy",
                             rope_scaling=dict(YARN, mscale=0.707, mscale_all_dim=0.707)),
    "deepseek_v3": dict(MLA, model_type="deepseek_v3", topk_method="noaux_tc", scoring_func="sigmoid",
                        norm_topk_prob=True, n_group=2, topk_group=1, rope_scaling=dict(YARN, mscale=1.0, mscale_all_dim=1.0)),
}


def _source(llama_dir, tmp_path, name):
    out = tmp_path / f"src-{name}"
    out.mkdir()
    tok_cfg = json.loads((llama_dir / "config.json").read_text())
    cfg = dict(CONFIGS[name], vocab_size=tok_cfg["vocab_size"], eos_token_id=tok_cfg["eos_token_id"],
               bos_token_id=tok_cfg["bos_token_id"], pad_token_id=tok_cfg["pad_token_id"])
    (out / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(llama_dir / f, out / f)
    model, _ = load_model(out, lazy=True, strict=False)
    mx.random.seed(2)
    weights = {k: 1 + 0.1 * mx.random.normal(v.shape) if k.endswith("norm.weight") else 0.05 * mx.random.normal(v.shape)
               for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    return out


def _recipe(name: str) -> str:
    """Q4_K_M as llama.cpp makes it: routers and the expert score bias unquantized."""
    return "F32" if name.endswith(".mlp.gate.weight") else _q4_k_m(name)


def _logits(folder, ids):
    model, _ = mlx_lm.load(str(folder))
    return np.array(model(mx.array([ids]))[0].astype(mx.float32))


def _dequantized(reader, name):
    t = reader[name]
    return gguf.quants.dequantize(np.array(t.data), t.tensor_type).astype(np.float32).reshape(
        tuple(int(d) for d in reversed(t.shape)))


def _reference_folder(src, gguf_file, imported, out):
    """The source's mlx-lm folder, its weights replaced by `gguf`'s dequantization of the file."""
    cfg = json.loads((src / "config.json").read_text())
    heads, nope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"]
    reader = {t.name: t for t in gguf.GGUFReader(str(gguf_file)).tensors}
    weights = {}
    for name, w in mx.load(str(src / "model.safetensors")).items():
        layer = f"blk.{name.split('.')[2]}." if name.startswith("model.layers.") else ""
        if name.endswith(("kv_b_proj.weight", "embed_q.weight", "unembed_out.weight")):
            if f"{layer}attn_kv_b.weight" in reader:
                kv = _dequantized(reader, f"{layer}attn_kv_b.weight").reshape(heads, -1, cfg["kv_lora_rank"])
                k, v = kv[:, :nope].swapaxes(1, 2), kv[:, nope:]
            else:
                k, v = _dequantized(reader, f"{layer}attn_k_b.weight"), _dequantized(reader, f"{layer}attn_v_b.weight")
            value = {"kv_b_proj.weight": lambda: np.concatenate([k.swapaxes(1, 2), v], axis=1),
                     "embed_q.weight": lambda: k, "unembed_out.weight": lambda: v}[name.split("self_attn.")[1]]()
        else:
            value = _dequantized(reader, gguf_name(name, "deepseek2"))
        weights[name] = mx.array(np.ascontiguousarray(value).reshape(w.shape))
    out.mkdir()
    shutil.copytree(src, out, dirs_exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    return out


CASES = [("deepseek_v2", True), ("deepseek_v2", False), ("deepseek_v2_lite", True), ("deepseek_v3", True),
         ("deepseek_v3", False)]


@pytest.mark.parametrize(("name", "mla_split"), CASES, ids=[f"{m}-{'k_b+v_b' if s else 'kv_b'}" for m, s in CASES])
def test_deepseek2_imports_and_equals_mlx_lm(model_dir, tmp_path, name, mla_split):
    src = _source(model_dir("llama"), tmp_path, name)
    model_type = CONFIGS[name]["model_type"]
    ids = mlx_lm.load(str(src))[1].encode(PROMPT)
    f32 = tmp_path / "f32.gguf"
    write_gguf(src, f32, "F32", arch="deepseek2", mla_split=mla_split)
    out = import_gguf(f32, tmp_path / "out32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == model_type
    assert cfg["rope_scaling"]["type"] == "yarn" and cfg["first_k_dense_replace"] == 1
    assert cfg["q_lora_rank"] == CONFIGS[name]["q_lora_rank"]
    np.testing.assert_allclose(_logits(out, ids), _logits(src, ids), atol=1e-4, rtol=1e-4)

    kq = tmp_path / "q4km.gguf"
    write_gguf(src, kq, _recipe, arch="deepseek2", mla_split=mla_split)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(kq)).tensors}
    assert {"Q4_K", "Q6_K"} <= set(types.values())
    outq = import_gguf(kq, tmp_path / "outq", widen_dtype="float32")
    w = mx.load(str(outq / "model.safetensors"))
    report = json.loads((outq / "config.json").read_text())["graphc_gguf"]["types"]
    if model_type == "deepseek_v3" and mla_split:  # the split form is mlx-lm's: both halves kept as stored
        assert w["model.layers.0.self_attn.embed_q.weight"].dtype == mx.uint32
        assert w["model.layers.0.self_attn.unembed_out.weight"].dtype == mx.uint32
        assert not any(r["transposed"] for r in report.values())
    elif model_type == "deepseek_v2" and mla_split:  # attn_k_b had to be transposed back: widened
        assert types["blk.0.attn_k_b.weight"] == "Q5_0"  # 64-wide rows: llama.cpp's fallback from Q4_K
        assert w["model.layers.0.self_attn.kv_b_proj.weight"].dtype == mx.float32
        assert report["Q5_0"]["transposed"] == cfg["num_hidden_layers"]
        lines = summary_lines(json.loads((outq / "config.json").read_text()))
        assert any("Q5_0: 3 tensors widened into mlx-lm's MLA layout" in line for line in lines), lines
    else:  # one attn_kv_b: as stored for v2; for v3 its value rows stay kept, its key rows widen
        kv_b = "kv_b_proj" if model_type == "deepseek_v2" else "unembed_out"
        assert w[f"model.layers.0.self_attn.{kv_b}.weight"].dtype == mx.uint32
    assert w["model.layers.1.mlp.switch_mlp.up_proj.weight"].dtype == mx.uint32
    ref = _reference_folder(src, kq, outq, tmp_path / "ref")
    b = _logits(ref, ids)
    np.testing.assert_allclose(_logits(outq, ids), b, atol=1e-4 * np.abs(b).max(), rtol=1e-4)


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3"])
def test_engine_serves_a_deepseek2_q4_k_m_file_like_mlx_lm(model_dir, tmp_path, monkeypatch, model_type):
    from mlx_lm.generate import generate_step

    from graphc.compiler.gguf import resolve_model_path
    from graphc.runtime import Engine, SamplingParams

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    src = _source(model_dir("llama"), tmp_path, model_type)
    f = tmp_path / f"{model_type}-Q4_K_M.gguf"
    write_gguf(src, f, _recipe, arch="deepseek2")
    ours = Engine.load(f).generate([PROMPT], SamplingParams(max_tokens=8, temperature=0.0))[0].token_ids
    model, tok = mlx_lm.load(str(resolve_model_path(f)))
    ref = [int(t) for t, _ in zip((t for t, _ in generate_step(mx.array(tok.encode(PROMPT)), model)), range(8))]
    assert ours == ref


def test_deepseek2_without_kv_b_is_named(model_dir, tmp_path):
    src = _source(model_dir("llama"), tmp_path, "deepseek_v2")
    weights = mx.load(str(src / "model.safetensors"))
    mx.save_safetensors(str(src / "model.safetensors"),
                        {k: v for k, v in weights.items() if not k.startswith("model.layers.2.self_attn.kv_b")})
    f = tmp_path / "broken.gguf"
    write_gguf(src, f, "F32", arch="deepseek2")
    with pytest.raises(GGUFError, match="layer 2 has neither attn_kv_b nor attn_k_b/attn_v_b"):
        import_gguf(f, tmp_path / "o")


def test_deepseek_v3_without_the_score_bias_reads_it_as_zero(model_dir, tmp_path):
    """llama.cpp loads exp_probs_b as optional; without it the router adds nothing."""
    src = _source(model_dir("llama"), tmp_path, "deepseek_v3")
    weights = mx.load(str(src / "model.safetensors"))
    mx.save_safetensors(str(src / "model.safetensors"),
                        {k: mx.zeros_like(v) if k.endswith("e_score_correction_bias") else v for k, v in weights.items()})
    f = tmp_path / "nobias.gguf"
    write_gguf(src, f, "F32", arch="deepseek2")
    stripped = tmp_path / "stripped.gguf"  # the same file without its exp_probs_b tensors
    reader = gguf.GGUFReader(str(f))
    w = gguf.GGUFWriter(str(stripped), "deepseek2")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for t in reader.tensors:
        if "exp_probs_b" not in t.name:
            w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert not any("exp_probs_b" in t.name for t in gguf.GGUFReader(str(stripped)).tensors)
    out = import_gguf(stripped, tmp_path / "o")
    assert json.loads((out / "config.json").read_text())["model_type"] == "deepseek_v3"
    ids = mlx_lm.load(str(src))[1].encode(PROMPT)
    np.testing.assert_allclose(_logits(out, ids), _logits(src, ids), atol=1e-4, rtol=1e-4)
