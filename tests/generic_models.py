"""Tiny random-weight models of architectures served by the generic lowering (the model's own
forward on graphc's caches), each chosen for what a hand-split forward would get wrong:

- gemma: embeddings scaled by sqrt(hidden) inside the model;
- cohere: logits multiplied by `logit_scale` (0.0625 here, as in the real models);
- phi: the final norm is `final_layernorm`, with partial rotary embeddings;
- gemma2: masks as arrays, a sliding window over a full KVCache, attention and final
  logit soft-caps; "gemma2_gqa" has grouped KV heads, whose attention scores are
  [B, kv, repeats, N, T] and need per-row masks of rank 5;
- gpt_bigcode: learned positions indexed by `cache.offset` as one integer, so rows at
  different positions cannot share a forward: served one request at a time;
- gemma3: a multimodal wrapper whose `language_model` graphc serves (text-only);
- baichuan_m1: a CacheList per layer (a state cache + a KV cache), sliding layers.

Configs written for these tests (small: a few layers, hidden <= 128, vocab 1024 — the BPE
tokenizer make-model ships); weights from graphc's modelgen (seeded, deterministic).
"""

from __future__ import annotations

import json
from pathlib import Path

WINDOW = 8
_BASE = dict(vocab_size=1024, hidden_size=64, num_hidden_layers=4, intermediate_size=128,
             num_attention_heads=4, num_key_value_heads=2)

CONFIGS = {
    "gemma": dict(_BASE, model_type="gemma", head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0),
    "cohere": dict(_BASE, model_type="cohere", logit_scale=0.0625, layer_norm_eps=1e-5, rope_theta=10000.0,
                   use_qk_norm=False),
    "phi": dict(_BASE, model_type="phi", num_key_value_heads=4, partial_rotary_factor=0.5, layer_norm_eps=1e-5),
    "gemma2": dict(_BASE, model_type="gemma2", num_key_value_heads=4, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                   attn_logit_softcapping=50.0, final_logit_softcapping=5.0, query_pre_attn_scalar=16,
                   sliding_window=WINDOW),
    "gemma2_gqa": dict(_BASE, model_type="gemma2", head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                       attn_logit_softcapping=50.0, final_logit_softcapping=5.0, query_pre_attn_scalar=16,
                       sliding_window=WINDOW),
    "gpt_bigcode": dict(model_type="gpt_bigcode", n_embd=64, hidden_size=64, n_layer=2, n_inner=128, n_head=4,
                        n_positions=1000, layer_norm_epsilon=1e-5, vocab_size=1024, num_key_value_heads=1),
    "gemma3": dict(model_type="gemma3", vocab_size=1024, hidden_size=64,
                   text_config=dict(model_type="gemma3_text", hidden_size=64, num_hidden_layers=4,
                                    intermediate_size=128, num_attention_heads=4, num_key_value_heads=1,
                                    head_dim=16, sliding_window=WINDOW, sliding_window_pattern=2,
                                    query_pre_attn_scalar=16, rope_theta=1000000.0,
                                    rope_local_base_freq=10000.0, vocab_size=1024)),
    "baichuan_m1": dict(_BASE, model_type="baichuan_m1", rope_theta=10000.0, sliding_window=WINDOW,
                        sliding_window_layers=[0, 2], conv_window=2, rms_norm_eps=1e-5),
}


def make_tiny(model_type: str, out: str | Path, seed: int = 0) -> Path:
    """Write `model_type`'s tiny model folder (config.json, weights, tokenizer) to `out`."""
    from graphc.compiler.modelgen.tokenizer import write_tokenizer
    from graphc.compiler.modelgen.weights import random_weights, save_weights

    cfg = dict(CONFIGS[model_type], torch_dtype="float32")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out, cfg["vocab_size"])
    save_weights(random_weights(cfg, seed), out)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return out
