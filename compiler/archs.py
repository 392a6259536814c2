"""The fast path: a loaded mlx-lm model taken apart into the graph's ops: embed, layers, final norm, head.

mlx-lm's `Model.__call__` fuses these; the fast path calls them separately so that
non-final prefill chunks skip the head, the logits node runs only on the last
position, and the compiled decode (runtime/compiled_decode.py) can run the fused decode
block the adapter supplies (`fused_decode`: the llama family's, compiler/fused_block.py).
Every other model type runs its own `__call__` (the generic lowering, compiler/lower.py).

An adapter is only a candidate: it serves a model only after the load-time self-check
(compiler/selfcheck.py) found its logits equal to the model's own forward; otherwise
binding falls back to the generic lowering. Each entry also has parity tests
(tests/test_parity_*.py). To add one: subclass ArchAdapter where the model differs
(embedding scale, norm name, head), add the model type to ADAPTERS, add a parity test.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .fused_block import FusedBlocks, llama_block, llama_blocks, llama_not_own_block, llama_unfusable


class ArchAdapter:
    """The default decomposition, right for llama-like models (llama, qwen3, gpt_oss, qwen3_next...)."""

    def __init__(self, model):
        self.model = model
        self.inner = model.model

    def embed(self, tokens: mx.array) -> mx.array:
        return self.inner.embed_tokens(tokens)

    @property
    def layers(self) -> list:
        return list(self.model.layers)

    def norm(self, h: mx.array) -> mx.array:
        return self.inner.norm(h)

    def head(self, h: mx.array) -> mx.array:
        if "lm_head" in self.model:
            return self.model.lm_head(h)
        return self.inner.embed_tokens.as_linear(h)

    def head_weight(self) -> mx.array | None:
        """The head as one dense [vocab, hidden] matrix when it is a plain `h @ W.T`, else None.

        For runtimes that run the product with their own kernel; quantized, biased or
        otherwise special heads return None and go through `head`.
        """
        if "lm_head" in self.model:
            lm = self.model.lm_head
            return lm.weight if type(lm) is nn.Linear and "bias" not in lm else None
        emb = self.inner.embed_tokens
        return emb.weight if type(emb) is nn.Embedding else None

    # -- the compiled decode's fused block (compiler/fused_block.py) ------------------
    def fused_decode(self):
        """The fused decode blocks this architecture supplies (graphc-owned weights; the model
        is left untouched). None here: its layers run as mlx-lm's own modules under mx.compile."""
        return FusedBlocks.none(self._no_fused_reason(), total=len(self.layers))

    def own_block(self, layer):
        """`block(layer, x, cache)`: the layer run by graphc on its own weights with its attention
        through `cache.attend` (contracts/decode_block.py), so a cache can put a kernel there
        (runtime/kernels/decode_attention.py); None where this architecture has no such block
        and the layer runs as mlx-lm's own module."""
        return None

    def fused_decode_preview(self) -> str:
        """What `fused_decode` would give, without building any weights (the plan's note)."""
        return f"no fused blocks: {self._no_fused_reason()}"

    def _no_fused_reason(self) -> str:
        family = type(self.model).__module__.rpartition(".")[2]
        return (f"{type(self).__name__} supplies no fused decode block for '{family}' (only the llama "
                "family's is written); its layers run as mlx-lm's own modules under mx.compile")


class LlamaAdapter(ArchAdapter):
    """Llama: the default decomposition, plus a fused decode block (q/k/v and gate/up as one matmul each)."""

    def fused_decode(self):
        return llama_blocks(self.layers)

    def own_block(self, layer):
        if llama_not_own_block(layer) is not None:
            return None
        return lambda layer, x, cache: llama_block(layer, None, x, cache)

    def fused_decode_preview(self) -> str:
        layers = self.layers
        reasons = [r for r in map(llama_unfusable, layers) if r is not None]
        n = len(layers) - len(reasons)
        if not n:
            return "no fused blocks: " + "; ".join(sorted(set(reasons)))
        return (f"fused q/k/v + gate/up in {n} of {len(layers)} blocks (LlamaAdapter.fused_decode; the fused "
                "copies are graphc's own arrays, the model is untouched)"
                + (f"; others: {'; '.join(sorted(set(reasons)))}" if reasons else ""))


class Gemma3Adapter(ArchAdapter):
    def embed(self, tokens):
        h = self.inner.embed_tokens(tokens)
        # Same scaling (rounded through bfloat16) as mlx-lm's Gemma3Model.
        return h * mx.array(self.model.args.hidden_size**0.5, mx.bfloat16).astype(h.dtype)


# Model types with a fast path (each proven by tests/test_parity_*.py and, at every load,
# by the self-check). Anything else runs the model's own forward.
ADAPTERS: dict[str, type[ArchAdapter]] = {
    "llama": LlamaAdapter,
    "qwen3": ArchAdapter,
    "gpt_oss": ArchAdapter,
    "qwen3_next": ArchAdapter,
    "gemma3_text": Gemma3Adapter,
}


def adapter_for(model, model_type: str) -> ArchAdapter | None:
    """The fast-path adapter for this model type, or None (the generic lowering serves it)."""
    cls = ADAPTERS.get(model_type)
    if cls is None or not hasattr(model, "model") or not hasattr(model.model, "embed_tokens"):
        return None
    return cls(model)
