"""Lowering: a Plan + its Binding become a callable that builds one lazy mx expression per batch.

Every op is a registered unit (compiler/ops/): its lowering function receives the step
context, its node (id, params with defaults, the ops that read it) and its input values,
and returns its output value; nothing is evaluated here — the runtime decides when to
`async_eval`. The forward ops dispatch on `binding.lowering` (fast: split embed / layers /
norm / head; generic: the model's own forward, chosen by the load-time self-check in
compiler/compile.py), so one graph runs on either.

The step is split at the op phases (compiler/ops/registry.py): `forward` runs `forward`
ops (and, on a final chunk, `final` ones: the logits); `head` runs the `head` ops once the
host edits (grammar masks) are known. The plan already holds only the nodes its batch kind
runs (build_plan prunes prefill-only nodes from the decode plan).
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from graphc.contracts.step import StepInputs, StepOutputs  # re-exported: the step contract

from .bind import Binding
from .bound import bound_nodes
from .ops import OPS, last_position
from .plan import Plan, build_plan


@attrs.define
class StepContext:
    binding: Binding
    inputs: StepInputs
    values: dict = attrs.field(factory=dict)
    plan: Plan | None = None  # the plan this step runs: the ops read its choices (e.g. "final chunk")

    def chosen(self, name: str) -> str | None:
        c = self.plan.choice(name) if self.plan is not None else None
        return c.choice if c is not None else None


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


class LoweredStep:
    """A plan made callable: `step(StepInputs) -> StepOutputs`, all outputs lazy."""

    def __init__(self, plan: Plan, binding: Binding):
        self.plan = plan
        self.binding = binding
        self.generic = binding.lowering != "fast"
        spec = binding.spec
        self._nodes = bound_nodes(spec, [s.node for s in plan.steps])
        kept = {n.id for n, *_ in self._nodes}
        self.outputs = {name: nid for name, nid in spec.outputs if nid in kept}
        self.hidden_node = next((n.id for n, *_ in self._nodes if n.op == "attention"), None)
        # The model's own logits (what the load-time self-check compares): the `logits` op node,
        # preferring the last-position one.
        logits_ops = [(n.id, ph) for n, _, _, ph in self._nodes if n.op == "logits"]
        self.model_logits_node = next((i for i, ph in logits_ops if ph == "final"),
                                      logits_ops[0][0] if logits_ops else None)
        # The logits the host edits (grammar masks, processors) are computed against: what the
        # logit_edits node reads (after any op a graph inserts, e.g. a soft-cap), else the above.
        edits = next((ins for n, _, ins, _ in self._nodes if n.op == "logit_edits"), None)
        self.logits_node = edits[0] if edits else self.model_logits_node

    def forward(self, inputs: StepInputs) -> StepContext:
        """The step up to (and including) the logits: the part that does not need host edits."""
        ctx = StepContext(self.binding, inputs, plan=self.plan)
        for name in self.binding.spec.inputs:
            ctx.values[name] = inputs.tokens
        self._run(ctx, ("forward", "final") if inputs.final else ("forward",))
        return ctx

    def from_hidden(self, inputs: StepInputs, hidden: mx.array) -> StepContext:
        """`forward` for a decoder stack run elsewhere (a mixed step, compiler/mixed_forward.py):
        `hidden` stands for the attention node's output, and the ops after it in the forward and
        final phases (the logits) run on it as this plan declares them."""
        ctx = StepContext(self.binding, inputs, plan=self.plan)
        for name in self.binding.spec.inputs:
            ctx.values[name] = inputs.tokens
        ctx.values[self.hidden_node] = hidden
        phases = ("forward", "final") if inputs.final else ("forward",)
        after = False
        for node, op, ins, phase in self._nodes:
            if node.id == self.hidden_node:
                after = True
            elif after and phase in phases:
                ctx.values[node.id] = op.lower(ctx, node, *[ctx.values[i] for i in ins])
        return ctx

    def head(self, ctx: StepContext, extra_edits: mx.array | None = None) -> StepOutputs:
        """The `head` ops (edits, selection, logprobs) on top of `forward`'s values.

        Split from forward so a host-computed edit row (a grammar mask) can be filled on the
        CPU while the device runs the forward, then applied without re-tracing the model.
        """
        if extra_edits is not None:
            ctx.inputs.extra_edits = extra_edits
        if ctx.inputs.final:
            self._run(ctx, ("head",))
        v = ctx.values
        logits = v.get(self.model_logits_node)
        values = {name: v.get(nid) for name, nid in self.outputs.items()}
        return StepOutputs(
            hidden=v.get(self.hidden_node), logits=last_position(logits) if logits is not None else None,
            next_tokens=values.get("next_tokens"), logprobs=values.get("logprobs"), values=values,
        )

    def _run(self, ctx: StepContext, phases: tuple) -> None:
        for node, op, inputs, phase in self._nodes:
            if phase in phases:
                ctx.values[node.id] = op.lower(ctx, node, *[ctx.values[i] for i in inputs])

    def fill_targets(self, ctx: StepContext) -> list:
        """What to evaluate for a chunk that only fills the cache: the caches' arrays. Not the
        hidden states / logits: the last layer's attention output and MLP (and on the generic
        path the head) feed nothing a later chunk needs, so MLX never computes them."""
        return cache_arrays(ctx.inputs.caches)

    def __call__(self, inputs: StepInputs) -> StepOutputs:
        return self.head(self.forward(inputs))


def lower(binding: Binding, kind: str, target=None, requested=None) -> LoweredStep:
    """The step of one batch kind; its plan's choices are made for `target` / `requested`
    (compiler/target.py; None: unprobed, nothing asked)."""
    return LoweredStep(build_plan(binding, kind, target, requested), binding)
