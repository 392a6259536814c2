"""The decode step's choice passes, in order: compile mode, decode layers, attention, matmuls,
K/V write, sampling, host read, speculative arm; then the `compile` line that sums them up.

Each reads `ChoiceContext` (options, binding, target, what the engine asked) and returns a
`Choice`; a pass may also add the plan's `passes` line that says the same in words (the pass
names and wording inspect has always shown: `compile`, `attention kernel`, `sampling kernel`,
`host read`).
"""

from __future__ import annotations

import attrs

from graphc.contracts.policies import rollback_problem

from ..choice import Choice
from ..decode_options import VACANT_ROWS, compile_pass
from ..layer_groups import TRACEABLE_KINDS, untraceable
from ..mixed_forward import why_not_mixable
from ..target import UNPROBED, Requested, Target

COMPILE_MODES = ("eager", "compiled", "auto", "measured")
ATTENTION = ("mlx sdpa", "cuda decode kernel")
SAMPLING = ("grouped", "fused mlx", "fused cuda")
VACANT = ("at once", "quarter", "copies", "reuse")
MIXED = ("separate", "fused")
# Where `requested` leaves them None (a plan compiled without an engine): the speculator's
# defaults (runtime/speculative/speculator.py default_pipeline / default_adaptive), which an
# engine resolves into `requested` itself.
SPEC_PIPELINE_DEFAULT = False
SPEC_ADAPTIVE_DEFAULT = True


@attrs.define
class ChoiceContext:
    binding: object
    options: dict  # the resolved decode options (compiler/decode_options.py resolve)
    target: Target
    requested: Requested
    has_verify: bool  # the decode plan keeps a verify node
    choices: dict = attrs.field(factory=dict)  # name -> Choice, as the passes made them
    lines: list = attrs.field(factory=list)  # (pass, detail) for Plan.passes

    @property
    def adapter(self):
        return self.binding.adapter if self.binding.lowering == "fast" else None

    def chosen(self, name: str) -> str | None:
        c = self.choices.get(name)
        return c.choice if c is not None else None

    @property
    def compiles(self) -> bool:
        return self.chosen("compile mode") in ("compiled", "auto", "measured")

    def source(self, key: str) -> str:
        """Where option `key`'s value came from, for a why."""
        v = self.options[key]
        if self.requested.decode_overrides.get(key) is not None:
            return f"the engine asks {key}={v!r}"
        word = str(v).lower() if isinstance(v, bool) or v is None else v
        if key in self.binding.spec.decode_options:
            return f"the graph declares decode: {{{key}: {word}}}"
        return f"decode: {{{key}: {word}}} by default"


def _untraceable_note(ctx: ChoiceContext) -> str | None:
    """Why no batch of this model could take a compiled step (runtime/compiled_decode.py _fixed), or None."""
    blocked = untraceable(ctx.binding.groups)
    if not blocked:
        paged = _rowless(ctx)  # a compiled step traces fixed-shape row buffers
        if paged:
            return f"compiled steps take only plain contiguous KV rows and {paged}"
        if _quantized(ctx) and ctx.target.device == "cuda":  # its trace attends by mx.quantized_matmul
            return ("compiled steps attend over quantized KV by MLX's quantized_matmul, which has no CUDA kernel "
                    "for most attention shapes; eager steps take graphc's quantized attention kernel")
        return None
    layers = "; ".join(f"{len(g.layers)} {g.name} layers ({', '.join(g.kinds_present)})" for g in blocked)
    return f"compiled steps take only layers on plain {', '.join(TRACEABLE_KINDS)} KV and this decoder has {layers}"


def _quantized(ctx: ChoiceContext) -> list:
    """The binding's `quantized` policies (runtime/cache/quantized.py: kv_bits)."""
    return [p for p in getattr(ctx.binding, "policies", ()) if p.name == "quantized"]


def _rowless(ctx: ChoiceContext) -> str | None:
    """Full-attention policies that keep something else than plain contiguous rows (the `paged`
    policy's pages, runtime/cache/paged.py: it says `batch_prefill = False`), in words; None."""
    names = sorted({p.name for p in getattr(ctx.binding, "policies", ())
                    if "full_attention" in p.LAYER_KINDS and not getattr(p.new_cache(), "batch_prefill", True)})
    return f"policy {', '.join(map(repr, names))} keeps its rows in pages" if names else None


def choose_compile_mode(ctx: ChoiceContext) -> Choice:
    mode = ctx.options["compile"]
    why = ctx.source("compile")
    blocked = _untraceable_note(ctx)
    if not mode:
        return Choice("compile mode", "eager", COMPILE_MODES, why + (f" ({blocked})" if blocked else ""))
    if ctx.binding.lowering != "fast":
        return Choice("compile mode", "eager", COMPILE_MODES,
                      f"{why}, but the generic lowering runs the model's own forward uncompiled (compile needs the "
                      "fast path)")
    if blocked:
        return Choice("compile mode", "eager", COMPILE_MODES, f"{why}, but {blocked}: every step runs eager")
    if mode == "measured":
        return Choice("compile mode", "measured", COMPILE_MODES,
                      f"{why}: per batch-size bucket the gate times both steps on live decode cycles and runs the "
                      f"faster (runtime/measured_gate.py){_quantized_kv(ctx)}", arms=("compiled", "eager"))
    if mode == "auto":
        return Choice("compile mode", "auto", COMPILE_MODES,
                      f"{why}: compiled up to runtime/compiled_decode.py AUTO_MAX_BATCH rows and AUTO_MAX_KV rows x "
                      f"KV capacity, eager beyond (where compiled measured slower on the H200){_quantized_kv(ctx)}")
    return Choice("compile mode", "compiled", COMPILE_MODES,
                  f"{why}: every eligible batch (plain FullKV caches{_quantized_kv(ctx)})")


def _quantized_kv(ctx: ChoiceContext) -> str:
    """Where kv_bits quantized the KV: that those layers compile too, and how (one clause)."""
    q = [p for p in getattr(ctx.binding, "policies", ()) if getattr(p, "name", None) == "quantized"]
    if not q:
        return ""
    return (f"; quantized KV ({q[0].params['bits']} bits) compiles too: codes, scales and biases at the capacity "
            "bucket, attention by mx.quantized_matmul as mlx-lm's quantized SDPA, never the CUDA attention kernel "
            "(runtime/compiled_decode_quantized.py)")


def choose_decode_layers(ctx: ChoiceContext) -> Choice | None:
    if not ctx.compiles:
        return None
    alts = ("fused block", "mlx-lm modules")
    if not ctx.options["fuse_projections"]:
        return Choice("decode layers", "mlx-lm modules", alts, "decode: {fuse_projections: false}")
    preview = ctx.binding.adapter.fused_decode_preview()
    return Choice("decode layers", "mlx-lm modules" if preview.startswith("no fused blocks") else "fused block",
                  alts, preview)


def kernel_layers(adapter, multiple: int) -> int:
    """Layers the attention kernel can serve: the architecture runs them as its own block
    (attention through `cache.attend`) and their heads fit the kernel (head dim a multiple of
    `multiple`, query heads a multiple of KV heads) — runtime/kernels/decode_attention.kernel_blocks."""
    n = 0
    for layer in adapter.layers if adapter is not None else ():
        a = getattr(layer, "self_attn", None)
        hd, hq, hkv = (getattr(a, k, 0) for k in ("head_dim", "n_heads", "n_kv_heads"))
        if adapter.own_block(layer) is not None and hd and hd % multiple == 0 and hkv and hq % hkv == 0:
            n += 1
    return n


def choose_compiled_attention(ctx: ChoiceContext) -> Choice | None:
    if not ctx.compiles:
        return None
    if not ctx.options["attention_kernel"]:
        return Choice("attention (compiled steps)", "mlx sdpa", ATTENTION, "decode: {attention_kernel: false}")
    why = ctx.target.why_not("decode_attention")
    if why is not None:
        return Choice("attention (compiled steps)", "mlx sdpa", ATTENTION, why)
    return Choice("attention (compiled steps)", "cuda decode kernel", ATTENTION,
                  f"device is cuda and the kernel matched MLX here ({ctx.target.note('decode_attention')}); layers "
                  f"whose head dim is a multiple of {ctx.target.kernel_head_dim_multiple}")


def choose_kv_write(ctx: ChoiceContext) -> Choice | None:
    if not ctx.compiles:
        return None
    alts = ("in the attention kernel", "scatter", "slice update")
    plain = "scatter" if ctx.target.device == "cuda" else "slice update"
    if not ctx.options["kv_write_kernel"]:
        return Choice("K/V write", plain, alts, "off (decode: {kv_write_kernel: false})")
    if ctx.chosen("attention (compiled steps)") != "cuda decode kernel":
        note = ctx.choices["attention (compiled steps)"].why
        return Choice("K/V write", plain, alts, "off (it runs in the attention kernel, which is off"
                      + ("" if not ctx.options["attention_kernel"] else f": {note}") + ")")
    why = ctx.target.why_not("kv_write")
    return Choice("K/V write", plain if why else "in the attention kernel", alts,
                  why or "its writing variant matched MLX here for every kernel kind that serves")


def choose_matmuls(ctx: ChoiceContext) -> Choice | None:
    if not ctx.compiles:
        return None
    alts = ("mlx matmul", "skinny kernel")
    why = ctx.target.why_not("skinny_matmul") if ctx.options["skinny_matmul"] else ctx.source("skinny_matmul")
    return Choice("projections (compiled steps)", "mlx matmul" if why else "skinny kernel", alts,
                  why or "device is cuda and the 2..64-row kernel matched MLX's matmul here")


def choose_residual(ctx: ChoiceContext) -> Choice | None:
    if not ctx.compiles:
        return None
    alts = ("separate add", "in the matmul (addmm)")
    why = ("off (decode: {residual_matmul: false})" if not ctx.options["residual_matmul"]
           else "off (not a CUDA device: mlx-lm's own adds, bit for bit)" if not ctx.target.cuda_adds
           else "off (the skinny matmul serves the projections)"
           if ctx.chosen("projections (compiled steps)") == "skinny kernel" else None)
    return Choice("residual adds", "separate add" if why else "in the matmul (addmm)", alts,
                  why or "device is cuda, where the step already rounds differently from mlx-lm's")


def choose_eager_attention(ctx: ChoiceContext) -> Choice:
    """Eager verify forwards and eager decode steps over left-padded rows (runtime/kernel_views.py)."""
    name, adapter = "attention (eager steps)", ctx.adapter
    if _quantized(ctx) and ctx.target.device == "cuda":
        w = ctx.target.why_not("quantized_attention")
        ww = ctx.target.why_not("quantized_write")
        write = ("their new keys / values quantized and written in one launch a layer (graphc's quantized "
                 "write kernel)" if ww is None else f"their new keys / values by mx.quantize and slice writes "
                 f"(write kernel off: {ww})")
        ctx.lines.append(("quantized KV attention", "llama blocks: decode and verify steps in graphc's quantized "
                          f"attention kernel over the codes, {write}; prompt chunks dequantized into mlx sdpa; "
                          "other layers: mlx-lm's quantized SDPA (runtime/cache/quantized.py)" if w is None else
                          f"mlx-lm's quantized SDPA (graphc's kernel off: {w})"))
    if not ctx.options["attention_kernel"]:
        why = "off (decode: {attention_kernel: false})"
    elif adapter is None:
        why = "off (the generic lowering runs the model's own forward)"
    elif not (n := kernel_layers(adapter, ctx.target.kernel_head_dim_multiple)):
        why = (f"off (no layer fits: {type(adapter).__name__} needs an own block for it and the kernel a head dim "
               f"that is a multiple of {ctx.target.kernel_head_dim_multiple})")
    elif (w := ctx.target.why_not("decode_attention")) is not None:
        why = f"off ({w})"
    else:
        note = f"on ({n} of {len(adapter.layers)} layers, {ctx.target.note('decode_attention')})"
        paged = _rowless(ctx)
        rows = (f"decode steps over paged rows ({paged}: each group of similar length gathered "
                "left-aligned)" if paged else
                "eager verify forwards and eager decode steps over left-padded rows")
        ctx.lines.append(("attention kernel", f"{rows}: attention in the ragged "
                          f"kernel, {note} (runtime/kernel_views.py)"))
        where = ("decode steps over paged rows, where MLX's attention has no fused kernel for an array mask; "
                 "prompt chunks and verify forwards: mlx sdpa" if paged else
                 "verify forwards and left-padded decode steps, where MLX's attention has no fused "
                 "kernel for L > 1 queries or an array mask; other eager steps: mlx sdpa")
        return Choice(name, "cuda decode kernel", ATTENTION, f"{note}: {where}")
    return Choice(name, "mlx sdpa", ATTENTION, why)


def choose_sampling(ctx: ChoiceContext) -> Choice:
    rule = ("; per batch: plain-greedy rows take argmax, greedy and top-k rows one fused selection, "
            "other rows the grouped sampler")
    on = bool(ctx.options["sampling_kernel"])
    off = "off (decode: {sampling_kernel: false})"
    why = ctx.target.why_not("top_ranks") if on else off
    if ctx.target.device == "cuda":  # the plan's line, as the engine has always printed it there
        line = f"candidate stage of fused sampled steps: {ctx.target.note('top_ranks') if on else off}"
        if on and why is None:
            line += f"; their top-p scan, filters and Gumbel-max: {ctx.target.note('gumbel_choose')}"
        ctx.lines.append(("sampling kernel", line))
    if why is None:
        return Choice("sampling", "fused cuda", SAMPLING,
                      "the top-ranks kernel matched MLX here (candidate stage of fused steps where its layout fits "
                      "the width and vocabulary)" + rule)
    return Choice("sampling", "fused mlx", SAMPLING, f"candidate stage in MLX's ops: {why}" + rule)


def choose_host_read(ctx: ChoiceContext) -> Choice:
    alts = ("tokens", "pieces")
    if not ctx.target.cuda_memory:
        return Choice("host read", "tokens", alts, "no managed memory on this device: nothing migrates")
    if ctx.options["host_read_pieces"]:
        ctx.lines.append(("host read", "8-byte copies of each step's tokens (MLX's scalar pool: no page a step "
                                       "uses migrates to the host)"))
        return Choice("host read", "pieces", alts, ctx.source("host_read_pieces"))
    ctx.lines.append(("host read", "the step's tokens themselves (decode: {host_read_pieces: true} reads "
                                   "8-byte copies)"))
    return Choice("host read", "tokens", alts, ctx.source("host_read_pieces"))


def choose_vacant_rows(ctx: ChoiceContext) -> Choice:
    """When the rows of requests that ended leave the decode batch (runtime/batch_rows.py). Every
    drop copies each kept row's KV; a step that widens the buffers (every 256 columns) or a join
    copies them anyway, so both modes drop vacant rows there. Between those copies a vacant row
    costs a row of every decode matmul: real work on the CPU, where a step's matmuls are
    compute-bound; close to nothing on a GPU at serving batch sizes, where they read the weights
    once for all rows (an H100 timeline of the 1B shape: plain steps of 64 and of 4 rows both
    5.1-5.2 ms, while each drop that kept 4-47 rows made a 13-37 ms step, docs/scheduling.md).
    "reuse" also spares the joins' copies: under arrivals over time each join copied the whole
    batch's KV (a 40-row batch: ~4.7 GB, 80-140 ms steps on an H100), and writing a joining row
    into a vacant one copies its own positions only."""
    name, asked = "vacant rows", ctx.options["vacant_rows"]
    if asked not in VACANT_ROWS:
        raise ValueError(f"decode option vacant_rows must be one of {VACANT_ROWS}, got {asked!r}")
    paged = _rowless(ctx)
    if paged:
        return Choice(name, "at once", VACANT, f"{paged}: a row that leaves gives its pages back, nothing is copied")
    if asked != "auto":
        return Choice(name, asked, VACANT, ctx.source("vacant_rows"))
    if ctx.target.device not in ("cuda", "gpu"):
        return Choice(name, "quarter", VACANT, f"vacant_rows=auto and device is {ctx.target.device}: a vacant row "
                      "costs a row of every decode matmul, so they are dropped once past a quarter of the batch, "
                      "and by any join or growth of the buffers (copies the batch takes anyway)")
    return Choice(name, "reuse", VACANT, f"vacant_rows=auto and device is {ctx.target.device}: decode matmuls read "
                  "the weights once for every row, so a vacant row costs next to nothing while dropping it copies "
                  "every kept row's KV; joining rows are written into vacant ones in place, and the rest are "
                  "dropped only by a join that does not fit or a growth of the buffers (copies the batch takes anyway)")


def choose_mixed_step(ctx: ChoiceContext) -> Choice:
    """Whether a step's prompt chunk runs in the decode step's forward (compiler/mixed_forward.py)
    or as a forward of its own. Off by default: it is exact, and on an H100 the fused forward alone
    was 1.46x the decode step against 2.64x for separate forwards, but at the door the engine's
    steps with prompt work cost the same either way and the fused ones had a far longer tail
    (docs/scheduling.md#mixed-steps)."""
    name = "mixed step"
    if not ctx.options["mixed_step"]:
        return Choice(name, "separate", MIXED, ctx.source("mixed_step") + ": a prompt chunk runs as a forward of its "
                      "own, before the decode step")
    why = why_not_mixable(ctx.binding)
    if why:
        return Choice(name, "separate", MIXED, f"{ctx.source('mixed_step')}, but {why}")
    return Choice(name, "fused", MIXED, f"{ctx.source('mixed_step')}: one request's prompt chunk a step rides the "
                  "decode forward (norms, projections and MLP once over rows + chunk, attention per part); a "
                  "final chunk's first token is read with that launch's tokens (the next step, when steps chain)")


def choose_speculative(ctx: ChoiceContext) -> Choice:
    r = ctx.requested
    name, alts = "speculative arm", ("plain", "verify", "pipelined", "measured")
    problem = rollback_problem(ctx.binding) or (None if ctx.has_verify else (
        f"graph '{ctx.binding.spec.name}' declares no verify node"))
    if problem:
        return Choice(name, "plain", alts, f"speculation off: {problem}")
    who = "rows that ask" if r.speculative in (None, "off") else f"every plain greedy row ({r.speculative} by default)"
    pipeline = SPEC_PIPELINE_DEFAULT if r.spec_pipeline is None else bool(r.spec_pipeline)
    adaptive = SPEC_ADAPTIVE_DEFAULT if r.spec_adaptive is None else bool(r.spec_adaptive)
    arms = ("plain", "verify", "pipelined") if pipeline else ("plain", "verify")
    if adaptive:
        return Choice(name, "measured", alts, f"for {who}: per batch-size bucket the gate runs the arm whose cycles "
                      "gave the slowest row tokens fastest (runtime/measured_gate.py)", arms=arms)
    arm = "pipelined" if pipeline else "verify"
    return Choice(name, arm, alts, f"for {who}: spec_adaptive=False, so {arm} whenever a row drafted")


DECODE_PASSES = (
    ("compile mode", choose_compile_mode),
    ("decode layers", choose_decode_layers),
    ("attention (compiled steps)", choose_compiled_attention),
    ("K/V write", choose_kv_write),
    ("projections (compiled steps)", choose_matmuls),
    ("residual adds", choose_residual),
    ("attention (eager steps)", choose_eager_attention),
    ("sampling", choose_sampling),
    ("host read", choose_host_read),
    ("vacant rows", choose_vacant_rows),
    ("mixed step", choose_mixed_step),
    ("speculative arm", choose_speculative),
)


def _compile_line(ctx: ChoiceContext) -> tuple | None:
    """The `compile` pass line: what the choices above applied, in the words inspect always used."""
    blocked = _untraceable_note(ctx)
    if ctx.options["compile"] and blocked and ctx.binding.lowering == "fast":
        return ("compile", f"declared but not applied: {blocked}")
    if ctx.target.device == "unprobed":  # no facts: what the adapter would fuse, kernels as conditions
        preview = ctx.binding.adapter.fused_decode_preview() if (
            ctx.options["fuse_projections"] and ctx.binding.adapter) else None
        return compile_pass(ctx.options, ctx.binding.lowering, {"fused": preview} if preview else None)
    if not ctx.compiles:
        return compile_pass(ctx.options, ctx.binding.lowering)
    c = ctx.choices
    att = c["attention (compiled steps)"]
    applied = {
        "fused": c["decode layers"].why if ctx.options["fuse_projections"] else None,
        "attention_kernel": (f"on ({ctx.target.note('decode_attention')})" if att.choice == "cuda decode kernel"
                             else f"off ({att.why if ctx.options['attention_kernel'] else 'off'})"),
        "kv_write_kernel": ("on (in the attention kernel)" if c["K/V write"].choice == "in the attention kernel"
                            else c["K/V write"].why),
        "residual_matmul": "on (mx.addmm)" if c["residual adds"].choice != "separate add" else c["residual adds"].why,
        "skinny_matmul": ("on" if c["projections (compiled steps)"].choice == "skinny kernel"
                          else f"off ({c['projections (compiled steps)'].why})"),
    }
    return compile_pass(ctx.options, ctx.binding.lowering, applied)


def run_decode_passes(ctx: ChoiceContext) -> tuple[tuple, list]:
    """(choices in pass order, the plan's passes lines they add)."""
    for name, fn in DECODE_PASSES:
        choice = fn(ctx)
        if choice is not None:
            assert choice.name == name, (choice.name, name)
            ctx.choices[name] = choice
    line = _compile_line(ctx)
    lines = ([line] if line else []) + ctx.lines
    return tuple(ctx.choices.values()), lines


__all__ = ["DECODE_PASSES", "ChoiceContext", "UNPROBED", "kernel_layers", "run_decode_passes"]
