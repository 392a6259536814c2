"""Lowering: a Plan + its Binding become a callable that builds one lazy mx expression per batch.

Each op has one rule (op name -> function). A rule receives the step context and its
input values and returns its output value; nothing is evaluated here — the runtime
decides when to `async_eval`.

Two rule tables, chosen per binding (`binding.lowering`, picked by the load-time
self-check in compiler/compile.py):

- RULES, the fast path: embed, the layer loop and norm + head run separately through
  an ArchAdapter (compiler/archs.py), the head only on the last position;
- GENERIC_RULES: the `attention` op is the model's OWN `model(tokens, cache=caches)` —
  its embedding scale, masks, layer loop, norms, logit scaling and soft-caps — on
  graphc's batched caches (they speak mlx-lm's cache protocol). It returns logits for
  every position, lazily: a non-final prefill chunk evaluates only the cache writes
  (`LoweredStep.fill_targets`), so the head over the chunk is never computed.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import mlx.core as mx

from .bind import Binding
from .plan import Plan, build_plan


@attrs.define
class StepInputs:
    """One batch, as the lowered step sees it."""

    tokens: mx.array  # int32 [B, L]; rows left-padded to a common length
    caches: list  # one LayerCache per layer
    final: bool = True  # prefill: the last chunk (run the head); decode: always True
    sampling: Any = None  # runtime.batch_sampling.SamplingState, or None: every row plain greedy
    key: mx.array | None = None  # RNG key for rows without a seed
    extra_edits: mx.array | None = None  # additive [B, V] rows computed on the host (grammar masks)
    # x @ w.T for the head's dense weight, when a runtime brings its own (the compiled decode
    # path's skinny-matmul kernel, runtime/compiled_decode.py); None: the model's head as is.
    matmul: Callable | None = None
    # The chunk's logits at every position are wanted (prompt logprobs): the generic lowering
    # then runs the final chunk as one forward instead of splitting off its last token.
    all_positions: bool = False


@attrs.define
class StepOutputs:
    hidden: mx.array
    logits: mx.array | None = None
    next_tokens: mx.array | None = None  # int32 [B]
    logprobs: Any = None  # a LogprobOutputs pack when some row asked


@attrs.define
class StepContext:
    binding: Binding
    inputs: StepInputs
    values: dict = attrs.field(factory=dict)


def _embed(ctx, node, tokens):
    return ctx.binding.adapter.embed(tokens)


def _attention(ctx, node, h):
    """The decoder stack. Masks are built once per (layer kind, window) from the first such layer's cache."""
    b, inputs = ctx.binding, ctx.inputs
    n = h.shape[1]
    masks = {}
    for layer, info, cache in zip(b.adapter.layers, b.layers, inputs.caches):
        key = (info.kind, info.window)
        if key not in masks:
            if info.kind == "linear_attention":
                masks[key] = cache.make_mask(n)
            else:
                masks[key] = cache.make_mask(n, window_size=info.window)
        # A layer cache may run its layer itself: the compiled decode path
        # (runtime/compiled_decode.py) runs llama blocks with fused projections.
        run = getattr(cache, "run_layer", None)
        h = layer(h, masks[key], cache) if run is None else run(layer, h, masks[key])
    return h


def _logits(ctx, node, h):
    if node.param_dict.get("positions", "last") == "last":
        h = h[:, -1:, :]
    adapter, mm = ctx.binding.adapter, ctx.inputs.matmul
    w = adapter.head_weight() if mm is not None else None
    h = adapter.norm(h)
    logits = adapter.head(h) if w is None else mm(h, w)
    if node.param_dict.get("dtype", "float32") == "float32":
        logits = logits.astype(mx.float32)
    return logits[:, -1, :] if logits.shape[1] == 1 else logits


def _logit_edits(ctx, node, logits):
    """Penalties, then additive rows (bias, bans, min_tokens), then host rows (grammar masks)."""
    s = ctx.inputs.sampling
    if s is not None:
        from graphc.runtime.sampling import edit_logits

        return edit_logits(logits, s.st, counts=s.counts, n_generated=s.n_generated,
                           additive_mask=ctx.inputs.extra_edits)
    if ctx.inputs.extra_edits is not None:
        return logits + ctx.inputs.extra_edits
    return logits


def _sample(ctx, node, logits):
    s = ctx.inputs.sampling
    if s is None or node.param_dict.get("method") == "greedy":
        return mx.argmax(logits, axis=-1).astype(mx.int32)
    from graphc.runtime.sampling import select_tokens

    return select_tokens(logits, s.st, s.positions, ctx.inputs.key)


def _logprobs(ctx, node, logits, tokens):
    s = ctx.inputs.sampling
    if s is None or not s.st.want_logprobs:
        return None
    from graphc.runtime.sampling import token_logprobs

    return token_logprobs(logits, s.st, tokens)


def _model_forward(ctx, node, tokens):
    """The model's own forward on graphc's caches: lazy logits [B, L, V] for every position.

    A final chunk of L > 1 tokens runs as two forwards, L-1 tokens then the last one, so the
    head (vocab x hidden per position: for a 128k vocabulary as much work as several layers)
    runs on one position instead of L; the first forward's logits are never evaluated. Any
    split of a prompt is exact (chunked prefill), and the self-check runs this path.
    """
    model, inputs = ctx.binding.model, ctx.inputs
    if ctx.binding.mask_rank != 4:  # per-row masks shaped for this model's scores (see full.py)
        for c in inputs.caches:
            for part in getattr(c, "caches", None) or [c]:
                part.mask_rank = ctx.binding.mask_rank
    n = tokens.shape[1]
    if inputs.final and n > 1 and not inputs.all_positions:
        model(tokens[:, :-1], cache=inputs.caches)
        return model(tokens[:, -1:], cache=inputs.caches)
    return model(tokens, cache=inputs.caches)


def _generic_logits(ctx, node, all_logits):
    logits = all_logits[:, -1, :] if node.param_dict.get("positions", "last") == "last" else all_logits
    if node.param_dict.get("dtype", "float32") == "float32":
        logits = logits.astype(mx.float32)
    return logits


def cache_arrays(obj) -> list:
    """Every mx.array a (possibly nested) layer cache holds: what a non-final chunk must evaluate."""
    if isinstance(obj, mx.array):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [a for x in obj for a in cache_arrays(x)]
    if hasattr(obj, "__dict__"):
        return [a for x in vars(obj).values() if isinstance(x, (mx.array, list, tuple)) or hasattr(x, "__dict__")
                for a in cache_arrays(x)]
    return []


RULES: dict[str, Callable] = {
    "embed": _embed,
    "attention": _attention,
    "logits": _logits,
    "logit_edits": _logit_edits,
    "sample": _sample,
    "logprobs": _logprobs,
}

GENERIC_RULES: dict[str, Callable] = RULES | {
    "embed": lambda ctx, node, tokens: tokens,  # the model's own forward embeds
    "attention": _model_forward,
    "logits": _generic_logits,
}

_HEAD_OPS = ("logits", "logit_edits", "sample", "logprobs")


class LoweredStep:
    """A plan made callable: `step(StepInputs) -> StepOutputs`, all outputs lazy."""

    def __init__(self, plan: Plan, binding: Binding):
        self.plan = plan
        self.binding = binding
        self.generic = binding.lowering != "fast"
        self.rules = GENERIC_RULES if self.generic else RULES
        spec = binding.spec
        self._nodes = [spec.node(s.node) for s in plan.steps]
        outputs = spec.output_dict
        self._next_tokens = outputs.get("next_tokens")
        self._logprobs = outputs.get("logprobs")
        self.hidden_node = next(n.id for n in self._nodes if n.op == "attention")
        self.logits_node = next(n.id for n in self._nodes if n.op == "logits")

    def forward(self, inputs: StepInputs) -> StepContext:
        """The step up to (and including) the logits: the part that does not need host edits."""
        ctx = StepContext(self.binding, inputs)
        for name in self.binding.spec.inputs:
            ctx.values[name] = inputs.tokens
        self._run(ctx, head=False)
        return ctx

    def head(self, ctx: StepContext, extra_edits: mx.array | None = None) -> StepOutputs:
        """Edits, selection and logprobs on top of `forward`'s logits.

        Split from forward so a host-computed edit row (a grammar mask) can be filled on the
        CPU while the device runs the forward, then applied without re-tracing the model.
        """
        if extra_edits is not None:
            ctx.inputs.extra_edits = extra_edits
        if ctx.inputs.final:
            self._run(ctx, head=True)
        v = ctx.values
        return StepOutputs(
            hidden=v[self.hidden_node],
            logits=v.get(self.logits_node),
            next_tokens=v.get(self._next_tokens),
            logprobs=v.get(self._logprobs) if self._logprobs else None,
        )

    def _run(self, ctx: StepContext, head: bool) -> None:
        for node in self._nodes:
            is_head = node.op in _HEAD_OPS and node.op != "logits"
            if is_head != head or (node.op == "logits" and not ctx.inputs.final):
                continue  # non-final prefill chunks only fill the cache
            ctx.values[node.id] = self.rules[node.op](ctx, node, *[ctx.values[i] for i in node.inputs])

    def fill_targets(self, ctx: StepContext) -> list:
        """What to evaluate for a chunk that only fills the cache: the caches' arrays. Not the
        hidden states / logits: the last layer's attention output and MLP (and on the generic
        path the head) feed nothing a later chunk needs, so MLX never computes them."""
        return cache_arrays(ctx.inputs.caches)

    def chunk_logits(self, ctx: StepContext) -> mx.array:
        """Logits at every position of the chunk [B, n, V] (prompt logprobs)."""
        h = ctx.values[self.hidden_node]
        if self.generic:
            return h
        adapter = self.binding.adapter
        return adapter.head(adapter.norm(h))

    def __call__(self, inputs: StepInputs) -> StepOutputs:
        return self.head(self.forward(inputs))


def lower(binding: Binding, kind: str) -> LoweredStep:
    return LoweredStep(build_plan(binding, kind), binding)
