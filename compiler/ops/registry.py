"""The op registry: one registration per op, holding everything the compiler knows about it.

    @register_op("soft_cap", inputs=("logits",), output="logits", phase="final",
                 params={"cap": Param(float, 30.0, doc="tanh cap")})
    def soft_cap(ctx, node, logits):
        return node.params["cap"] * mx.tanh(logits / node.params["cap"])

A registration is the op's whole contract: the value types it reads and produces
(validation checks edges against them), its params (validation checks them; the
lowering function is the only reader, so a param exists only if it changes what the
lowering builds), when it runs (`phase`, `kinds`, `on_request`) and how it is shown by
`graphc inspect` (`describe`). Built-in ops register the same way (compiler/ops/*.py); a
graph's `plugins:` can register more before validation.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

# Value types the built-in ops exchange. Plugins may use their own names: an edge is valid
# when producer and consumer name the same type.
TOKENS = "tokens"  # int32 [B, L]
HIDDEN = "hidden"  # float [B, L, D]
LOGITS = "logits"  # float [B, V] (positions: last) or [B, L, V] (positions: all)
LOGPROBS = "logprobs"  # runtime.sampling.LogprobsOutput (chosen, top-N, requested ids)
PROMPT_LOGPROBS = "prompt_logprobs"  # PromptLogprobs: per-position logprob of the next input token
EMBEDDINGS = "embeddings"  # float32 [B, D]
TOKEN_SCORES = "token_scores"  # TokenScores: per-position logprob of the next input token + greedy flag

# When an op's lowering runs within one step (LoweredStep splits the step at these points):
#   forward  every batch, every prefill chunk (the cache writes live here)
#   final    the final chunk of a prompt (and every decode step), before host edits are known
#   head     the final chunk, after host edits (grammar masks) were filled on the CPU
PHASES = ("forward", "final", "head")
BATCH_KINDS = ("prefill", "decode")


@attrs.frozen
class Param:
    """One accepted parameter: its type, default and (optionally) allowed values."""

    type: type | tuple
    default: Any = None
    choices: tuple | None = None
    check: Callable[[Any], str | None] | None = None  # returns a problem or None
    doc: str = ""

    @property
    def type_name(self) -> str:
        if isinstance(self.type, type):
            return self.type.__name__
        return " or ".join(t.__name__ for t in self.type)


@attrs.frozen
class BoundNode:
    """What a lowering function sees of its node: id, op and params with defaults filled in."""

    id: str
    op: str
    params: dict
    consumers: tuple = ()  # ops of the nodes that read this one
    # A `logits` node with `positions: all` reads this one for an output computed on every batch
    # (not only for rows that ask): the forward must keep every position (graphs/score.yaml).
    all_positions: bool = False


@attrs.frozen
class OpDef:
    name: str
    inputs: tuple  # value types, in order
    output: str  # value type
    lower: Callable  # (ctx: StepContext, node: BoundNode, *input values) -> output value (lazy)
    params: dict = attrs.field(factory=dict)
    phase: str | Callable = "forward"  # a PHASES entry, or fn(params) -> one
    kinds: tuple = BATCH_KINDS  # batch kinds it runs in; the plan drops it (and what only feeds it) elsewhere
    on_request: bool = False  # computes something only for rows that ask (inspect: "rows that ask")
    describe: Callable | None = None  # fn(node: BoundNode, binding, kind) -> one line for inspect
    check: Callable | None = None  # fn(node: NodeSpec, spec: GraphSpec) -> [problem str]: graph-level rules
    doc: str = ""
    module: str = ""  # where it was registered (inspect shows plugin ops' origin)

    def phase_for(self, params: dict) -> str:
        return self.phase(params) if callable(self.phase) else self.phase

    def resolved(self, params: dict) -> dict:
        """params with every declared default filled in."""
        out = {k: p.default for k, p in self.params.items()}
        out.update(params)
        return out


OPS: dict[str, OpDef] = {}


def register_op(name: str, *, inputs, output: str, params: dict | None = None, phase="forward",
                kinds=BATCH_KINDS, on_request: bool = False, describe=None, check=None, doc: str = "",
                replace: bool = False):
    """Decorator registering `fn` as the lowering of op `name` (see the module docstring).

    Registering a name twice is an error unless `replace=True` (a plugin imported twice under
    two module names would otherwise silently shadow the first registration)."""
    if isinstance(inputs, str):
        inputs = (inputs,)
    if callable(phase) is False and phase not in PHASES:
        raise ValueError(f"op '{name}': phase must be one of {', '.join(PHASES)} (or a function of the params), "
                         f"got {phase!r}")
    bad = [k for k in kinds if k not in BATCH_KINDS]
    if bad:
        raise ValueError(f"op '{name}': unknown batch kind(s) {bad} (known: {', '.join(BATCH_KINDS)})")

    def deco(fn: Callable) -> Callable:
        if name in OPS and not replace and OPS[name].lower is not fn:
            raise ValueError(f"op '{name}' is already registered (by {OPS[name].module}); "
                             "pick another name or pass replace=True")
        OPS[name] = OpDef(name, tuple(inputs), output, fn, dict(params or {}), phase, tuple(kinds), on_request,
                          describe, check, doc or (fn.__doc__ or "").strip().split("\n")[0],
                          getattr(fn, "__module__", ""))
        return fn

    return deco


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op '{name}' (registered: {', '.join(sorted(OPS))})") from None


def model_dtype_key(node_id: str) -> tuple:
    """Where a `logits` node declared float32 also leaves its logits in the model's own dtype
    (StepContext.values; a tuple, so no graph node id can collide with it). Upcasting to float32 is
    exact, so a reader that only compares values (greedy argmax) may read these instead: the cast
    is then never computed (lazy), and the argmax reads half the bytes."""
    return (node_id, "model dtype")


def is_model_dtype_key(key) -> bool:
    return isinstance(key, tuple) and len(key) == 2 and key[1] == "model dtype"


def last_position(logits):
    """[B, V] from logits that may carry every position ([B, L, V]): what selection reads."""
    return logits[:, -1, :] if logits.ndim == 3 else logits


def needs_all_positions(node, spec, what: str) -> list[str]:
    """Validator check for ops that read every position's logits (prompt logprobs, scoring):
    their logits input must come from a `positions: all` logits node."""
    src = node.inputs[0] if node.inputs else None
    try:
        producer = spec.node(src)
    except KeyError:
        return []  # a dangling input is reported by the edge check
    if producer.op == "logits" and dict(producer.params).get("positions", "last") != "all":
        return [f"input '{src}' has logits for the last position only; {what} need "
                "`positions: all` on that logits node"]
    return []
