"""Which model types graphc may refuse, and why.

A refusal is allowed only for a type listed here; any other refusal fails the sweep (a model
that used to be served and no longer is). The reason is what docs/models.md shows; the
refusal message itself must name the model type (checked by the test).

FAIL (wrong tokens or logits, an exception after load) is never allowed for any type.
"""

REFUSED: dict[str, str] = {
    "deepseek_v41": "its layers use mlx-lm's LayerCache (compressed KV with an indexer), which graphc "
    "has no batched equivalent of",
    "gemma3n": "layers share KV with earlier layers (num_kv_shared_layers) through the cache's "
    "keys_and_values(), which graphc's windowed policy does not provide yet",
    "llama4": "chunked attention (ChunkedKVCache): its mask is built from one offset shared by the whole "
    "batch; graphc would need a batched chunked-KV cache",
    "plamo3": "its sliding layers ask for a mask window one longer than the cache's window; graphc's "
    "windowed cache cannot serve that mask",
}
