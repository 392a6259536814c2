"""The compiler's front door: file -> spec -> validated -> bound -> plans and lowered steps."""

from __future__ import annotations

import logging
import os

import attrs
from mlx_lm.models.cache import make_prompt_cache

from .bind import Binding, LayerInfo, bind, default_graph_for
from .cachekinds import layers_from_caches, model_type_of, native_reasons, text_model
from .errors import GraphError, UnsupportedModel
from .gated_delta_layer import chunked_reference
from .ir import GraphSpec
from .lower import LoweredStep, lower
from .parse import parse_collect, resolve_graph_path
from .plan import Plan
from .selfcheck import chunking_changes_output, reference_run, run_check
from .target import Requested, Target
from .validate import validate

# The prefill plan's choice for gated-delta prompt chunks, and the reference an engine that asks for
# the chunked form is checked against where it rounds past the tolerance on mlx-lm's loop.
LINEAR_CHOICE = "linear attention (prompt chunks)"
CHUNKED_REFERENCE = "mlx-lm's forward with the chunked recurrence"


def load_spec(graph: str | os.PathLike, config: dict | None = None) -> GraphSpec:
    """Parse and validate a graph file; raises GraphError listing every problem."""
    path = resolve_graph_path(graph)
    spec, diags = parse_collect(path.read_text(), str(path), config)
    if spec is not None:
        diags += validate(spec)
    if spec is None or any(d.severity == "error" for d in diags):
        raise GraphError(diags)
    return spec


@attrs.define
class CompiledGraph:
    """A graph bound to a model, with one lowered step per batch kind."""

    spec: GraphSpec
    binding: Binding
    prefill: LoweredStep
    decode: LoweredStep

    vocab_size: int = 0  # the width of the model's logits (from the self-check's reference run)
    # What the choice passes were given (compiler/target.py); siblings (embed, score) reuse them.
    target: Target = attrs.field(factory=Target)
    requested: Requested = attrs.field(factory=Requested)

    def plan(self, kind: str) -> Plan:
        return {"prefill": self.prefill, "decode": self.decode}[kind].plan

    def with_decode(self, step) -> "CompiledGraph":
        """A new CompiledGraph whose decode step is `step`: the runtime's realization of this
        one's decode plan (runtime/compiled_decode.py build_decode_step). `step.plan` must be
        this decode plan: the realization obeys the plan, it does not rewrite it."""
        if step.plan is not self.decode.plan:
            raise ValueError("a decode step realizing this graph must carry its decode plan unchanged")
        return attrs.evolve(self, decode=step)


log = logging.getLogger("graphc.compile")

LOWERINGS = ("auto", "fast", "generic")


# Full-attention policies `kv_bits` may replace: the shared-prefix one, and the no-sharing one
# (which stays without a prefix cache), or a graph that is quantized already (new bits win).
KV_BITS_REPLACES = ("pool_backed", "full", "quantized")


def with_kv_bits(spec: GraphSpec, bits: int, group_size: int | None = None) -> GraphSpec:
    """The graph with its full-attention layers on the built-in `quantized` policy (opt-in, not
    exact: runtime/cache/quantized.py): what `--kv-bits` / `Engine.load(kv_bits=)` do. Refuses,
    naming the option, a graph it cannot rewrite (never serves something else instead)."""
    entries = [c for c in spec.cache if c.layer_type == "full_attention"]
    if not entries:
        raise ValueError(f"kv_bits={bits}: graph '{spec.name}' declares no full_attention cache entry to quantize")
    entry = entries[0]
    if entry.policy not in KV_BITS_REPLACES:
        raise ValueError(f"kv_bits={bits}: graph '{spec.name}' keeps full_attention KV in policy '{entry.policy}', "
                         f"which kv_bits does not replace (it replaces {', '.join(KV_BITS_REPLACES)}); declare "
                         "`full_attention: {policy: quantized, bits: ...}` in the graph instead")
    params = dict(entry.params) if entry.policy == "quantized" else {}
    params["bits"] = bits
    if group_size is not None:
        params["group_size"] = group_size
    if entry.policy == "full":
        params["prefix"] = False  # the no-sharing graph stays without a prefix cache
    q = attrs.evolve(entry, policy="quantized", params=tuple(params.items()))
    return attrs.evolve(spec, cache=tuple(q if c.layer_type == "full_attention" else c for c in spec.cache))


def declares_quantized(graph, config: dict) -> bool:
    """Whether `graph` keeps KV in the `quantized` policy (None: a default graph, which never does);
    False where it does not parse (compile_graph then says why): the engine probes the quantized
    attention kernel only for such graphs or kv_bits (runtime/target.py)."""
    if graph is None:
        return False
    try:
        spec = load_spec(graph, config)
    except Exception:  # noqa: BLE001 - compile_graph reports a bad graph with its file and line
        return False
    return any(c.policy == "quantized" for c in spec.cache)


def _lossy_reference(binding: Binding, served, mtype: str, ref, context=None):
    """The self-check's reference for policies that round KV on purpose: mlx-lm's own forward on
    the mlx-lm cache each such policy reproduces (`reference_cache()`: QuantizedKVCache for
    `quantized`), the other layers on their usual caches. `ref` when no policy has one.
    `context`: what the forward runs in (reference_run)."""
    makers = [getattr(p, "reference_cache", None) for p in binding.policies]
    if not any(makers):
        return ref

    def caches(model):
        return [m() if m else c for m, c in zip(makers, make_prompt_cache(model))]

    name = next(p.describe() for p, m in zip(binding.policies, makers) if m)
    try:
        return reference_run(served, mtype, make_caches=caches, context=context)
    except UnsupportedModel as e:
        # MLX's CUDA quantized_matmul lacks kernels for most attention shapes (none at head dim 64):
        # say what to do instead of leaving the user with the backend's shape message alone.
        hint = ("; on CUDA, MLX's quantized_matmul has no kernel for this attention shape "
                "(docs/cache-policies.md#quantized-kv): serve without --kv-bits"
                if "No implementation for problem shape" in str(e) else "")
        raise UnsupportedModel(f"{name} (kv_bits): mlx-lm's own forward cannot run this model on its quantized "
                               f"KV cache either, so there is nothing to check graphc against: {e}{hint}") from e


def compile_graph(graph: str | os.PathLike | None, model, config: dict, lowering: str = "auto",
                  kv_bits: int | None = None, kv_group_size: int | None = None, *,
                  target: Target | None = None, requested: Requested | None = None) -> CompiledGraph:
    """Pick (when None), parse, validate, bind and lower a graph for a loaded model.

    Layer kinds come from the model's own caches (compiler/cachekinds.py). `lowering`:
    "auto" tries the fast path where the model type has one and falls back to the
    generic one (the model's own forward) if the self-check (compiler/selfcheck.py)
    fails; "fast" insists on the fast path; "generic" skips it. A model no lowering
    serves exactly is refused (UnsupportedModel) naming its type and the difference.

    `target` (the device's facts, runtime/target.py probe_target) and `requested` (what the
    engine's options ask of decode) are the choice passes' inputs (compiler/passes/): the decode
    plan's `choices` say which attention, sampling, compile mode and speculative arms run, and why.
    """
    target, requested = target or Target(), requested or Requested()
    if lowering not in LOWERINGS:
        raise ValueError(f"unknown lowering '{lowering}' (known: {', '.join(LOWERINGS)})")
    served = text_model(model)
    mtype = model_type_of(served, config)
    ref = reference_run(served, mtype)
    layers = layers_from_caches(ref.caches, mtype, served, make_prompt_cache(served))
    auto_graph = graph is None
    if graph is None:
        graph = default_graph_for(layers)
    spec = load_spec(graph, config)
    if kv_bits is not None:
        spec = with_kv_bits(spec, kv_bits, kv_group_size)
    elif kv_group_size is not None:
        raise ValueError("kv_group_size is a setting of kv_bits (quantized KV); pass kv_bits=8 or 4 with it")
    if "next_tokens" not in spec.output_dict:
        # An embedding / scoring graph: the self-check compares next-token logits, so it runs on
        # the model's generation graph, and this graph reuses what that check chose.
        return compile_sibling(compile_graph(None, model, config, lowering, target=target, requested=requested),
                               graph, model)
    binding = bind(spec, model, config, layers, mtype, target=target)
    if kv_bits is not None and not any(p.name == "quantized" for p in binding.policies):
        raise UnsupportedModel(f"kv_bits={kv_bits}: model type '{mtype}' has no full-attention layers to quantize "
                               f"(its layers: {', '.join(sorted({l.kind for l in layers}))})")
    # Policies that round KV on purpose are checked against mlx-lm on the same rounding; such a
    # graph is never served by a fallback that drops it (the last resort below).
    lossy = [p for p in binding.policies if getattr(p, "reference_cache", None)]
    ref = _lossy_reference(binding, served, mtype, ref)
    if lowering == "fast" and binding.adapter is None:
        raise ValueError(f"model type '{mtype}' has no fast path (compiler/archs.py ADAPTERS); "
                         "use lowering='auto' or 'generic'")
    tries = ["generic"] if lowering == "generic" or binding.adapter is None else (
        ["fast"] if lowering == "fast" else ["fast", "generic"])
    natives = native_reasons(layers)
    checks: list = []  # every lowering tried, in order; each try gets its own Binding (_checked)
    if natives:
        # Some layer keeps mlx-lm's own cache (no batching): one request at a time, or refused.
        name = tries[-1]
        compiled = _checked(spec, binding, ref, name, checks, batched=False, target=target, requested=requested)
        if compiled is not None:
            log.warning("%s; serving one request at a time on mlx-lm's own cache", natives[0])
            return compiled
        raise UnsupportedModel(f"{natives[0]} Served one request at a time on mlx-lm's own cache it does not match "
                               f"either ({checks[-1].describe()}: {checks[-1].error}).")
    for name in tries:
        compiled = _checked(spec, binding, ref, name, checks, batched=True, target=target, requested=requested)
        if compiled is None and _chunked_failed(checks[-1]) and requested.linear_prefill == "auto":
            # The chunked gated-delta form rounds differently from mlx-lm's per-position loop; on
            # some models (bf16, mixtures of experts) that compounds past the tolerance. The same
            # lowering on the loop is exact per row: try it before leaving the fast path (the
            # prefill pass reads this failed check from the binding and chooses the loop).
            compiled = _checked(spec, binding, ref, name, checks, batched=True, target=target, requested=requested)
            if compiled is not None:
                log.warning("model type '%s': the chunked gated-delta prompt form failed the self-check (%s); "
                            "prompt chunks run mlx-lm's per-position loop (%s)", mtype, checks[-2].describe(),
                            checks[-1].describe())
                return compiled
        elif compiled is None and _chunked_failed(checks[-1]) and requested.linear_prefill == "chunked":
            # Asked for by the engine: its rounding is accepted, its machinery (batching, caches,
            # chunk boundaries) is not. Checked against mlx-lm's own forward with the same
            # recurrence in its gated-delta layers, at the usual tolerance.
            compiled = _checked(spec, binding, _chunked_reference_run(binding, served, mtype), name, checks,
                                batched=True, target=target, requested=requested, reference=CHUNKED_REFERENCE)
            if compiled is not None:
                log.warning("model type '%s': linear_prefill='chunked' rounds past the self-check's tolerance "
                            "against mlx-lm's per-position loop (%s); served as asked, checked against %s (%s)",
                            mtype, checks[-2].describe(), CHUNKED_REFERENCE, checks[-1].describe())
                return compiled
        if compiled is not None:
            if checks[:-1] and checks[0].lowering != name:
                log.warning("model type '%s': the fast path failed the self-check (%s); serving the generic "
                            "lowering (the model's own forward)", mtype, checks[0].describe())
            return compiled
    last = checks[-1]
    if last.batched_only and last.lowering == "generic":
        # Exact one request at a time, wrong when rows share a forward. Models that split
        # attention scores by KV group ([B, kv, repeats, N, T]: gemma2) need per-row masks of
        # rank 5; try that, batched.
        compiled = _checked(spec, binding, ref, "generic", checks, batched=True, target=target,
                            requested=requested, mask_rank=5)
        if compiled is not None:
            log.info("model type '%s': batched with per-row masks of rank 5", mtype)
            return compiled
    if last.batched_only:
        # Still exact only one request at a time: serve it unbatched rather than refuse it —
        # slower, never wrong.
        compiled = _checked(spec, binding, ref, last.lowering, checks, batched=False, target=target,
                            requested=requested)
        if compiled is not None:
            log.warning("model type '%s': its forward is exact one request at a time but not on batches of "
                        "rows at different positions (%s); serving one request at a time", mtype, last.error)
            return compiled
    tried = "; ".join(c.describe() for c in checks)
    if lossy:
        raise UnsupportedModel(
            f"model type '{mtype}': {lossy[0].describe()} (kv_bits) does not reproduce mlx-lm's own forward on "
            f"its QuantizedKVCache ({tried}; first difference: {last.error}). Refusing rather than serve it on "
            "other caches; load it without kv_bits")
    if auto_graph and lowering != "fast" and not natives:
        # Last resort: every layer on mlx-lm's own cache, one request at a time — the model's
        # own forward on its own caches, only chunked; exact unless chunking changes it.
        compiled = _on_own_caches(model, config, mtype, ref, f"graphc's caches do not reproduce it ({tried})",
                                  target, requested)
        if compiled is not None:
            return compiled
    need = "a cache policy or model fix (see docs/models.md)"
    raise UnsupportedModel(
        f"model type '{mtype}': no lowering reproduces mlx-lm's own forward on graphc's caches "
        f"({tried}; first difference: {last.error}). Refusing to serve it rather than be wrong; "
        f"serving it would need {need}")


def _on_own_caches(model, config: dict, mtype: str, ref, why: str, target: Target,
                   requested: Requested) -> CompiledGraph | None:
    chunked = chunking_changes_output(text_model(model), ref)
    if chunked is not None:  # its own caches would reproduce only one chunking of it: refuse
        raise UnsupportedModel(f"model type '{mtype}': {why}, and {chunked}. Serving it would need the model's "
                               "masks and caches to agree (a model fix in mlx-lm)")
    reason = f"model type '{mtype}': {why}. To batch it graphc would need a fix in its caches or the model"
    layers = [LayerInfo(i, "native", cache_type=type(c).__name__, native=c, native_reason=reason)
              for i, c in enumerate(make_prompt_cache(text_model(model)))]
    spec = load_spec("hybrid", config)
    binding = bind(spec, model, config, layers, mtype)
    compiled = _checked(spec, binding, ref, "generic", [], batched=False, target=target, requested=requested)
    if compiled is not None:
        log.warning("%s; serving one request at a time on mlx-lm's own caches", reason)
    return compiled


def _checked(spec, bound: Binding, ref, lowering: str, checks: list, batched: bool, target: Target,
             requested: Requested, mask_rank: int = 4, reference: str | None = None) -> CompiledGraph | None:
    """The graph lowered with `lowering`, if it passes the self-check (the result is appended to
    `checks` either way). `bound` is bind()'s Binding; each try lowers its own copy of it."""
    trial = attrs.evolve(bound, lowering=lowering, mask_rank=mask_rank, checks=checks)
    # The self-check runs the plans the target gets (a final chunk whole or split, as served).
    compiled = CompiledGraph(spec, trial, lower(trial, "prefill", target, requested),
                             lower(trial, "decode", target, requested))
    result = run_check(compiled, ref, lowering, batched=batched)
    linear = compiled.prefill.plan.choice(LINEAR_CHOICE)
    if linear is not None or reference is not None:
        result = attrs.evolve(result, linear_prefill=linear and linear.choice, reference=reference)
    checks.append(result)
    if not result.ok:
        return None
    log.info("model type '%s': %s lowering, self-check %s", trial.model_type, lowering, result.describe())
    # Lowered again now that the check is known (the plans print it: inspect): a new Binding and
    # CompiledGraph whose steps carry their final plans from construction.
    binding = attrs.evolve(trial, checks=checks, check=result, batched=batched)
    return CompiledGraph(spec, binding, lower(binding, "prefill", target, requested),
                         lower(binding, "decode", target, requested), vocab_size=ref.vocab, target=target,
                         requested=requested)


def _chunked_failed(check) -> bool:
    """A fast check, against mlx-lm's own forward, that failed with the chunked gated-delta form."""
    return (not check.ok and check.lowering == "fast" and check.linear_prefill == "chunked"
            and check.reference is None and check.max_abs_diff is not None)


def _chunked_reference_run(binding: Binding, served, mtype: str):
    """mlx-lm's own forward (on the KV rounding's caches where a policy rounds KV) with the chunked
    recurrence in its gated-delta layers' prompt chunks (compiler/gated_delta_layer.py)."""
    def context():
        return chunked_reference(getattr(served, "layers", ()))

    with context():
        return _lossy_reference(binding, served, mtype, reference_run(served, mtype, context=context),
                                context=context)


def compile_sibling(compiled: CompiledGraph, graph: str | os.PathLike, model) -> CompiledGraph:
    """Another graph (embed, score, a user's) on the model `compiled` already serves.

    It reuses the layer kinds and the lowering the main graph's load-time self-check chose
    (the forward ops are the same; only the ops after them differ), so no second check runs."""
    b0 = compiled.binding
    spec = load_spec(graph, b0.config)
    # What the check chose, and found about batching this model.
    binding = attrs.evolve(bind(spec, model, b0.config, b0.layers, b0.model_type, target=compiled.target),
                           lowering=b0.lowering, check=b0.check, checks=b0.checks, batched=b0.batched,
                           mask_rank=b0.mask_rank)
    t, r = compiled.target, compiled.requested  # the plans' choice passes on the same inputs
    return CompiledGraph(spec, binding, lower(binding, "prefill", t, r), lower(binding, "decode", t, r),
                         vocab_size=compiled.vocab_size, target=t, requested=r)


__all__ = ["CompiledGraph", "GraphError", "UnsupportedModel", "compile_graph", "compile_sibling", "load_spec"]
