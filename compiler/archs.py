"""How to take a loaded mlx-lm model apart into the graph's ops: embed, layers, final norm, head.

mlx-lm's `Model.__call__` fuses these; graphc calls them separately so that
non-final prefill chunks skip the head and the logits node runs only on the rows
and positions that need it. Each entry is checked against mlx-lm's own forward in
tests/test_parity_*.py.
"""

from __future__ import annotations

import mlx.core as mx


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
        import mlx.nn as nn

        if "lm_head" in self.model:
            lm = self.model.lm_head
            return lm.weight if type(lm) is nn.Linear and "bias" not in lm else None
        emb = self.inner.embed_tokens
        return emb.weight if type(emb) is nn.Embedding else None


class Gemma3Adapter(ArchAdapter):
    def embed(self, tokens):
        h = self.inner.embed_tokens(tokens)
        # Same scaling (rounded through bfloat16) as mlx-lm's Gemma3Model.
        return h * mx.array(self.model.args.hidden_size**0.5, mx.bfloat16).astype(h.dtype)


ADAPTERS: dict[str, type[ArchAdapter]] = {
    "gemma3_text": Gemma3Adapter,
}


def adapter_for(model) -> ArchAdapter:
    model_type = getattr(model, "model_type", None) or getattr(getattr(model, "args", None), "model_type", "")
    cls = ADAPTERS.get(model_type, ArchAdapter)
    if not hasattr(model, "model") or not hasattr(model.model, "embed_tokens"):
        raise NotImplementedError(
            f"model type '{model_type}' does not have the model.embed_tokens / model.layers / model.norm "
            "layout graphc knows; add an ArchAdapter for it in compiler/archs.py"
        )
    return cls(model)
