"""The load-time self-check: a lowering serves a model only after it matched the model's own forward here.

Reference: mlx-lm's own `model(tokens, cache=make_prompt_cache(model))`, one prompt at a
time, each prompt whole; where a row misses it, the same forward with the prompt's last token
fed alone, as mlx_lm.generate feeds it (`schedules`) — on a GPU one position takes other kernels
than several, and a bf16 mixture of experts turns that last-bit difference into another
expert. A row passes if it matches either. mlx-lm's own batch (its BatchGenerator) is no
reference: on 9 model types it answers a request other than its one-request forward does
(tests/conformance/mlx_lm_batch.py).

Checked: the lowered prefill and decode steps with graphc's caches, as the runner drives
them — prompts prefilled alone in chunks (the first one split, so a non-final chunk fills
the cache without the head), then joined into one left-padded batch of rows of different
lengths and decoded two steps; and, where the policies allow batched prefill, the same
prompts prefilled together left-padded. Every last-position logit row must equal the
reference within a dtype-aware tolerance.

It runs a dozen tokens: well under a second on a tiny model on the CPU. A failure of
the fast path falls back to the generic one; a failure of the generic path refuses the
model (compiler/compile.py). Decode steps run here, so a model whose forward cannot run
on batched caches fails at load, never on its first request.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import attrs
import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from graphc.contracts.step import StepInputs

from .errors import UnsupportedModel

# Two prompts of different lengths (ids small enough for any vocabulary), the first longer
# than CHUNK so its prefill has a non-final chunk; then two decode tokens for both rows.
PROMPTS = ((11, 23, 5, 17, 29, 3, 8), (19, 7, 26, 2))
DECODE = (9, 13)
CHUNK = 4

# Allowed max |graphc - reference| over the logits, relative to max(1, max |reference|):
# float32 should agree to rounding; half types round each layer's output.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 4e-2}

# Quantized weights: the quantized matmul picks its kernel by row count (a vector kernel for
# one row, a tiled one for several), and the two accumulate the dequantized products in
# different orders. On the CPU they agree to float32 rounding; MLX's CUDA kernels do not:
# SmolLM2-135M Q4_1 with float32 activations differed by 3.2e-4 of the logit scale between
# the one-row reference and the batched rows on an H200 (max |diff| 0.0097, scale 30), three
# times the float32 bound. So a quantized model's bound is at least this; a wrong lowering
# (a missed scale, a shifted row) is off by whole units of the scale, far above it.
QUANTIZED_TOLERANCE = 1e-3


def is_quantized(model) -> bool:
    """Whether any of the model's layers hold quantized weights (nn.QuantizedLinear,
    QuantizedEmbedding, mlx-lm's QuantizedSwitchLinear, ...)."""
    return any(type(m).__name__.startswith("Quantized") for _, m in model.named_modules())


@attrs.define
class Reference:
    """What mlx-lm's own forward gives on the check's tokens."""

    logits: list  # per prompt: [prefill last row, after DECODE[0], after DECODE[1]] as float32 [V]
    caches: list  # mlx-lm's caches after the first prompt's run: they show each layer's kind and shapes
    dtype: str  # the model's logits dtype
    vocab: int
    quantized: bool = False  # the model holds quantized weights (QUANTIZED_TOLERANCE applies)
    # (prompt index) -> [(schedule, rows)] for the prompt's other schedules; run only when a row
    # misses the whole-prompt one (most models match it, and each schedule costs forwards)
    rerun: Callable | None = None
    _others: dict = attrs.field(factory=dict, init=False)

    def others(self, i: int) -> list:
        """[(pieces, rows like logits[i])] of mlx-lm's forward with prompt i fed in its other schedules."""
        if i not in self._others:
            self._others[i] = self.rerun(i) if self.rerun is not None else []
        return self._others[i]

    @property
    def scale(self) -> float:
        return max(1.0, max(float(mx.abs(x).max()) for row in self.logits for x in row))

    @property
    def tolerance(self) -> float:
        rel = TOLERANCE.get(self.dtype, 4e-2)
        if self.quantized:
            rel = max(rel, QUANTIZED_TOLERANCE)
        return rel * self.scale


@attrs.frozen
class CheckResult:
    lowering: str  # "fast" | "generic"
    ok: bool
    max_abs_diff: float | None  # None when the lowering raised
    tolerance: float
    error: str | None = None  # the exception a lowering raised, or the first mismatch
    batched: bool = True  # False: checked one request at a time (rows never share a forward)
    batched_only: bool = False  # failed, but only where rows shared a forward
    mask_rank: int = 4
    # How the checked prefill folded gated-delta prompt chunks ("chunked" / "mlx-lm"); None for
    # models without such layers. A chunked form that fails is retried on mlx-lm's loop (compile.py).
    linear_prefill: str | None = None
    # What stood in for mlx-lm's own forward, if anything did (an engine that asks for the chunked
    # gated-delta form is checked against mlx-lm's forward with that recurrence in its layers).
    reference: str | None = None
    # Rows that missed the whole-prompt reference and matched mlx-lm's forward with the prompt's
    # last token fed alone: "prompt 0 prefill: (6, 1)" (schedules)
    other_schedules: tuple = attrs.field(default=(), converter=tuple)

    @property
    def name(self) -> str:
        name = self.lowering
        if self.linear_prefill == "chunked":
            name += ", chunked gated-delta prompts"
        if self.reference:
            name += f", against {self.reference}"
        if not self.batched:
            return f"{name} (one request at a time)"
        return name if self.mask_rank == 4 else f"{name} (rank-5 row masks)"

    def describe(self) -> str:
        if self.error and self.max_abs_diff is None:
            return f"{self.name}: raised {self.error}"
        verdict = "ok" if self.ok else "MISMATCH"
        if self.other_schedules:
            verdict += (f"; {len(self.other_schedules)} rows matched mlx-lm's forward with the prompt's last token "
                        f"fed alone, as mlx_lm.generate feeds it ({', '.join(self.other_schedules[:2])}"
                        f"{', ...' if len(self.other_schedules) > 2 else ''})")
        return f"{self.name}: max |diff| {self.max_abs_diff:.3g} (tolerance {self.tolerance:.3g}) {verdict}"


def schedules(n: int) -> list[tuple[int, ...]]:
    """The pieces mlx-lm's own forward is fed an n-token prompt in, the reference's first: whole,
    then the last token alone (mlx_lm.generate prefills all but the last token, which its first
    step runs; graphc runs a final chunk's last token alone where the plan splits it:
    compiler/passes/prefill_choices.py). Not the check's chunks: a cache whose answer depends on
    how a prompt is chunked is wrong, and graphc's chunks at serving time are not the check's."""
    return list(dict.fromkeys([(n,), (n - 1, 1) if n > 1 else (n,)]))


def _rows(model, cache, prompt, pieces) -> tuple[list, str]:
    """The last prefill row and both decode rows of `prompt` fed in `pieces`, as float32; the
    logits' own dtype."""
    a = 0
    for n in pieces:
        y = model(mx.array(prompt[a:a + n])[None], cache=cache)
        a += n
    rows = [y[0, -1]] + [model(mx.array([[t]]), cache=cache)[0, -1] for t in DECODE]
    rows = [r.astype(mx.float32) for r in rows]
    mx.eval(rows)
    return rows, str(y.dtype).replace("mlx.core.", "")


def reference_run(model, model_type: str, make_caches=None, context=None) -> Reference:
    """The check's tokens through mlx-lm's own forward and caches. Refuses a model that cannot run them.

    `make_caches(model)`: the caches to run on instead of `make_prompt_cache(model)` (a policy
    that rounds KV on purpose is checked against mlx-lm's cache of that rounding: compile.py).
    `context()`: a context manager the model runs in (compile.py's chunked recurrence), entered
    again when the other schedules run later."""
    new_caches = make_caches or make_prompt_cache
    out, first_caches, dtype = [], None, None
    try:
        for p in PROMPTS:
            cache = new_caches(model)
            rows, dtype = _rows(model, cache, p, (len(p),))
            out.append(rows)
            first_caches = first_caches or cache
    except Exception as e:  # noqa: BLE001 - any failure of the model's own code is a refusal reason
        raise UnsupportedModel(
            f"model type '{model_type}': mlx-lm's own forward with its own caches failed on a "
            f"{len(PROMPTS[0])}-token prompt: {type(e).__name__}: {e}. graphc serves only what mlx-lm runs."
        ) from e

    def rerun(i: int) -> list:
        p, got = PROMPTS[i], []
        with context() if context is not None else contextlib.nullcontext():
            for pieces in schedules(len(p))[1:]:
                try:
                    got.append((pieces, _rows(model, new_caches(model), p, pieces)[0]))
                except Exception:  # noqa: BLE001 - a schedule mlx-lm cannot run is no reference
                    continue
        return got

    return Reference(out, first_caches, dtype, int(out[0][0].shape[-1]), is_quantized(model), rerun=rerun)


def run_check(compiled, ref: Reference, lowering: str, batched: bool = True) -> CheckResult:
    """Drive the compiled steps over the check's tokens; compare with `ref`.

    batched=False checks the model served one request at a time: each prompt decoded alone."""
    pols = compiled.binding.policies
    tol = ref.tolerance + max(p.lossy_tolerance for p in pols) * ref.scale
    diffs: list[float] = []
    worst: list[str] = []

    single_bad: list[str] = []  # mismatches where no rows shared a forward

    others: list[str] = []  # rows that matched another schedule of mlx-lm's forward

    def distance(got, want) -> float:
        d = float(mx.abs(got - want).max())
        return d if not math.isnan(d) else math.inf

    def compare(got, i, k, what):
        got = got.astype(mx.float32)
        d = distance(got, ref.logits[i][k])
        if not d <= tol:
            alt = min(((distance(got, rows[k]), pieces) for pieces, rows in ref.others(i)), default=None)
            if alt is not None and alt[0] <= tol:
                d = alt[0]
                others.append(f"{what}: {alt[1]}")
        if not d <= tol:
            worst.append(f"{what}: max |diff| {d:.3g}")
            if "(batched" not in what:
                single_bad.append(what)
        diffs.append(d)

    stage = "prefill"
    try:
        batch = None
        for i, p in enumerate(PROMPTS):
            stage = f"prompt {i} prefill"
            caches = [pol.new_cache() for pol in pols]
            for a in range(0, len(p), CHUNK):
                end = min(len(p), a + CHUNK)
                step = compiled.prefill
                ctx = step.forward(StepInputs(mx.array(p[a:end], dtype=mx.int32)[None], caches, final=end == len(p)))
                if end < len(p):
                    mx.eval(step.fill_targets(ctx))
                    continue
                compare(step.head(ctx).logits[0], i, 0, f"prompt {i} prefill")
            if not batched:
                for s, t in enumerate(DECODE):
                    stage = f"prompt {i} decode step {s + 1}"
                    out = compiled.decode(StepInputs(mx.array([[t]], dtype=mx.int32), caches))
                    compare(out.logits[0], i, s + 1, stage)
            elif batch is None:
                batch = caches
            else:
                stage = "joining rows into one decode batch (batched)"
                for mine, theirs in zip(batch, caches):
                    mine.extend(theirs)
        for s, t in enumerate(DECODE if batched else ()):
            stage = f"decode step {s + 1} (batched, rows of different lengths)"
            out = compiled.decode(StepInputs(mx.array([[t]] * len(PROMPTS), dtype=mx.int32), batch))
            for i in range(len(PROMPTS)):
                compare(out.logits[i], i, s + 1, f"prompt {i} decode step {s + 1} (batched)")
        if batched and batch_prefill_ok(pols):
            stage = "prefill (batched, left-padded)"
            L = max(map(len, PROMPTS))
            pads = [L - len(p) for p in PROMPTS]
            caches = [type(pol.new_cache())(len(PROMPTS), pads) for pol in pols]
            toks = mx.array([[0] * n + list(p) for n, p in zip(pads, PROMPTS)], dtype=mx.int32)
            out = compiled.prefill(StepInputs(toks, caches, final=True))
            for i in range(len(PROMPTS)):
                compare(out.logits[i], i, 0, f"prompt {i} prefill (batched, left-padded)")
    except Exception as e:  # noqa: BLE001 - a lowering that raises is a failed check, reported at load
        return CheckResult(lowering, False, None, tol, f"{type(e).__name__}: {e} (at {stage})", batched,
                           batched_only=batched and not single_bad and "(batched" in stage,
                           mask_rank=compiled.binding.mask_rank)
    return CheckResult(lowering, not worst, max(diffs), tol, worst[0] if worst else None, batched,
                       batched_only=bool(worst) and not single_bad, mask_rank=compiled.binding.mask_rank,
                       other_schedules=others)


def batch_prefill_ok(policies) -> bool:
    """Whether several prompts may share one left-padded prefill: every layer's cache says it keeps
    plain left-padded rows (`batch_prefill = True`: runtime/cache/full.py's FullKV and its subclasses)."""
    return all(getattr(p.new_cache(), "batch_prefill", False) for p in policies)


# Windows up to this size are checked for chunk invariance at load (a prompt of window + 5
# tokens through the model's own forward, whole and in chunks); larger ones would make the
# check cost a long prefill, and no shipped model with such a window depends on chunking.
CHUNK_CHECK_MAX_WINDOW = 1024


def chunking_changes_output(model, ref: Reference) -> str | None:
    """Why mlx-lm's own forward on its own caches gives other logits when the prompt is
    prefilled in chunks than in one piece (None when it does not, or cannot be checked cheaply).

    Serving a model on its own caches (the last resort) is exact only when chunked prefill
    is: plamo3's sliding layers mask window + 1 keys while its rotating cache keeps window,
    so its answer depends on the prefill chunk size — no batching engine can match both."""
    def windows(caches):
        for c in caches:
            sub = getattr(c, "caches", None)
            if sub is not None:
                yield from windows(sub)
            elif isinstance(c, RotatingKVCache):
                yield c.max_size

    sizes = list(windows(make_prompt_cache(model)))
    if not sizes or min(sizes) > CHUNK_CHECK_MAX_WINDOW:
        return None
    w = min(sizes)
    vocab = ref.vocab
    tokens = mx.array([(7 * i + 3) % vocab for i in range(w + 5)], dtype=mx.int32)[None]
    whole = model(tokens, cache=make_prompt_cache(model))[0, -1].astype(mx.float32)
    cache, chunk = make_prompt_cache(model), max(1, w // 2)
    for i in range(0, tokens.shape[1], chunk):
        last = model(tokens[:, i:i + chunk], cache=cache)
    diff = float(mx.abs(whole - last[0, -1].astype(mx.float32)).max())
    if diff <= ref.tolerance:
        return None
    return (f"mlx-lm's own forward gives different logits for a {w + 5}-token prompt prefilled whole and in "
            f"{chunk}-token chunks (max |diff| {diff:.3g}, sliding window {w}), so no chunked engine can "
            "reproduce it")
