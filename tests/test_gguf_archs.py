"""GGUF architectures beyond llama/qwen: mixtral (llama + experts), qwen2moe, qwen3moe, phi3, gemma2, gemma3.

Each source model is an mlx-lm model class with random weights (tiny config); the `gguf`
package writes it as llama.cpp lays that architecture out (expert tensors stacked, phi3's
fused q|k|v and gate|up rows kept fused, llama-family q/k rows permuted), as F32 and as a
Q4_K_M-style mix (Q4_K + Q6_K); the import must give mlx-lm's logits, on the source
weights (F32) or on the file's dequantized weights (K-quants). Other architectures are
refused by name.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the test extra's `gguf` package writes the synthetic files")

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from gguf_writer import write_gguf  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402
from test_gguf_kquants import _q4_k_m, _reference_folder  # noqa: E402

from graphc.compiler.gguf import GGUFError, import_gguf  # noqa: E402

PROMPT = "Once upon a time, a small fox found a key under the old bridge."
BASE = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": False}
CONFIGS = {
    "mixtral": (dict(BASE, model_type="mixtral", intermediate_size=256, num_local_experts=4,
                     num_experts_per_tok=2), "llama"),
    "qwen3_moe": (dict(BASE, model_type="qwen3_moe", intermediate_size=512, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=256, decoder_sparse_step=1,
                       mlp_only_layers=[], norm_topk_prob=True, head_dim=64), "qwen3moe"),
    "phi3": (dict(BASE, model_type="phi3", intermediate_size=512), "phi3"),
    "qwen2_moe": (dict(BASE, model_type="qwen2_moe", intermediate_size=512, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=256, shared_expert_intermediate_size=512), "qwen2moe"),
    "gemma3_text": (None, "gemma3"),
    "gemma2": (dict(BASE, model_type="gemma2", intermediate_size=512, head_dim=64, attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0, query_pre_attn_scalar=64, tie_word_embeddings=True), "gemma2"),
}


def _source(llama_dir, tmp_path, model_type):
    """A random-weight mlx-lm `model_type` folder, with the llama test model's tokenizer."""
    if model_type == "gemma3_text":  # graphc make-model builds it (sliding window pattern 2)
        from graphc.compiler.modelgen import make_model

        return make_model("gemma3_text", tmp_path / "src-gemma3", hidden_size=256, intermediate_size=512,
                          num_heads=4, num_kv_heads=1, head_dim=64, num_layers=2)
    cfg, _ = CONFIGS[model_type]
    out = tmp_path / f"src-{model_type}"
    out.mkdir()
    tok_cfg = json.loads((llama_dir / "config.json").read_text())
    cfg = dict(cfg, vocab_size=tok_cfg["vocab_size"], eos_token_id=tok_cfg["eos_token_id"],
               bos_token_id=tok_cfg["bos_token_id"], pad_token_id=tok_cfg["pad_token_id"])
    (out / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(llama_dir / f, out / f)
    model, _ = load_model(out, lazy=True, strict=False)
    mx.random.seed(1)
    weights = {k: mx.random.normal(v.shape) * 0.05 if not k.endswith("norm.weight") else 1 + 0.1 * mx.random.normal(v.shape)
               for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    return out


def _recipe(name: str) -> str:
    """Q4_K_M as llama.cpp makes it: the expert router (ffn_gate_inp) is never quantized."""
    routers = (".mlp.gate.weight", ".block_sparse_moe.gate.weight", "shared_expert_gate.weight")
    return "F32" if name.endswith(routers) else _q4_k_m(name)


def _logits(folder, ids):
    model, _ = mlx_lm.load(str(folder))
    return np.array(model(mx.array([ids]))[0].astype(mx.float32))


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_arch_imports_and_equals_mlx_lm(model_dir, tmp_path, model_type):
    src = _source(model_dir("llama"), tmp_path, model_type)
    _, gguf_arch = CONFIGS[model_type]
    ids = mlx_lm.load(str(src))[1].encode(PROMPT)
    f32 = tmp_path / "f32.gguf"
    write_gguf(src, f32, "F32", arch=gguf_arch)
    out = import_gguf(f32, tmp_path / "out32")
    assert json.loads((out / "config.json").read_text())["model_type"] == model_type
    np.testing.assert_allclose(_logits(out, ids), _logits(src, ids), atol=1e-4, rtol=1e-4)
    kq = tmp_path / "q4km.gguf"
    write_gguf(src, kq, _recipe, arch=gguf_arch)
    outq = import_gguf(kq, tmp_path / "outq", widen_dtype="float32")
    ref = _reference_folder(kq, outq, tmp_path / "ref", gguf_arch)
    b = _logits(ref, ids)
    np.testing.assert_allclose(_logits(outq, ids), b, atol=1e-4 * np.abs(b).max(), rtol=1e-4)


@pytest.mark.parametrize("arch", ["gemma", "gpt2"])
def test_other_architectures_are_refused_by_name(model_dir, tmp_path, arch):
    f = tmp_path / "a.gguf"
    write_gguf(model_dir("llama"), f, "F16", arch=arch)
    with pytest.raises(GGUFError, match=f"architecture '{arch}' is not supported"):
        import_gguf(f, tmp_path / "o")


@pytest.mark.parametrize("model_type", ["llama", "mixtral"])
def test_engine_serves_a_q4_k_m_file_like_mlx_lm(model_dir, tmp_path, monkeypatch, model_type):
    """graphc's own engine on the .gguf path: greedy tokens equal mlx-lm's on the same folder."""
    from mlx_lm.generate import generate_step

    from graphc.compiler.gguf import resolve_model_path
    from graphc.runtime import Engine, SamplingParams

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    llama = model_dir("llama", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2, num_layers=2)
    src = llama if model_type == "llama" else _source(model_dir("llama"), tmp_path, model_type)
    f = tmp_path / f"{model_type}-Q4_K_M.gguf"
    write_gguf(src, f, _recipe, arch="llama")
    ours = Engine.load(f).generate([PROMPT], SamplingParams(max_tokens=8, temperature=0.0))[0].token_ids
    model, tok = mlx_lm.load(str(resolve_model_path(f)))
    ref = [int(t) for t, _ in zip((t for t, _ in generate_step(mx.array(tok.encode(PROMPT)), model)), range(8))]
    assert ours == ref
