"""How a compiled decode trace's caches answer the model's layers (runtime/compiled_decode_kv.py for
bf16 KV, runtime/compiled_decode_quantized.py for quantized KV): the one mask the trace was built
with, and each layer run through the fused blocks where the plan built them."""

from __future__ import annotations


class TraceLayers:
    """Mixin of a trace's layer caches; they set `mask` and `fused` (the fused-block runner)."""

    def make_mask(self, N, window_size=None, return_array=False):
        if window_size is not None:
            raise ValueError("compiled decode serves full-attention layers only")
        return self.mask

    # Called by the lowering's attention rule in place of `layer(h, mask, cache)`.
    def run_layer(self, layer, h, mask):
        out = self.fused.run(layer, h, self)
        if out is None:
            out = self.run_block(layer, h)
        return layer(h, mask, self) if out is None else out

    def run_block(self, layer, h):
        """A cache's own block for `layer` where the fused runner has none (None: the layer as is)."""
        return None
