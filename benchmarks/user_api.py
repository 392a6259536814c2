"""`graphc bench --user-api`: graphc and mlx-lm measured the way users call them.

Where `graphc bench` times decode windows inside a warm engine (GC off, prefill outside),
this suite times whole public calls, as an application sees them:

- graphc: `Engine.generate(prompts, SamplingParams(...))` on one Engine kept across calls
  (defaults otherwise: prefix cache on, default `prefill_chunk`), with `compile=True`,
  with `compile="auto"` (compiled only up to 64 rows) and, with `--compile-measured`, with
  `compile="measured"` (compiled or eager per batch size by timing, runtime/measured_gate.py),
  and, with `--user-skinny`, with `compile="auto", skinny_gemm=True` (contestant graphc_skinny:
  the skinny matmul kernel for the compiled step's projections; CUDA only, where it checks);
- mlx-lm: `mlx_lm.batch_generate` (with `completion_batch_size` >= the batch, so every row
  decodes together), and a plain loop over the mlx-lm model and its KV cache;

on B prompts of fresh random tokens per call (no prefix-cache hits), Python's GC on.

decode   steady ms/step = (T(long new tokens) - T(short new tokens)) / (long - short): the
         prefill and the first tokens cancel out. Greedy and sampled
         (temperature 0.8, top-p 0.9, top-k 50).
sampled  the sampled case also runs graphc greedy on the same Engine right after each sampled
         repeat (`graphc_greedy`), so every repeat gives one sampled / greedy ratio measured
         back to back: `sampled_over_greedy` is their min / median / max (1.05 = 5 % over greedy).
         The same calls also give `sampled_over_greedy_per_step`: the ratio of the long calls'
         median decode steps (step_profile's timers on graphc's Engine), which leaves out the
         admission steps and stalls a whole call carries.
prefill  cold prompts, one new token each: median time to first token over the requests
         and prompt tok/s (prompt tokens / wall), graphc against BatchGenerator (what
         `batch_generate` drives, with its defaults) and a plain per-request mlx-lm prefill.

Every measurement is repeated (`repeats`, >= 3) and reported as min / median / max. A ratio
is the baseline's median over graphc's (above 1: graphc is faster); it is flagged `noise`
when either side's spread (max - min) is larger than the difference of the medians it claims.
"""

from __future__ import annotations

import random
import time
from statistics import median
from typing import Callable

import attrs
import mlx.core as mx
from mlx_lm import batch_generate as bg
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler

from graphc.runtime.kernels import skinny_matmul

from . import contestants as C
from .grounded import run_grounded
from .step_profile import instrument, uninstrument

now = time.perf_counter
SAMPLING = {"temperature": 0.8, "top_p": 0.9, "top_k": 50}
USER_WORKLOADS = ("decode", "sampled", "prefill", "grounded")


@attrs.define
class UserConfig:
    batches: tuple = (1, 64)
    prompt_len: int = 128
    short_new: int = 16
    long_new: int = 144
    repeats: int = 3
    prefill_cases: tuple = ((32, 2048), (1, 8192))
    workloads: tuple = USER_WORKLOADS
    compile: bool = True
    seed: int = 0
    num_draft_tokens: int | None = None  # grounded: k (None: the default)
    measured: bool = False  # also graphc with compile="measured" (contestant graphc_measured)
    skinny: bool = False  # also graphc with compile="auto", skinny_gemm=True (contestant graphc_skinny)


# -- the contestants, each one public call -----------------------------------------------------
class GraphcUser:
    """One Engine kept across calls, as an application keeps it."""

    def __init__(self, model, tokenizer, config, **engine_kw):
        self.engine = C.make_engine(model, tokenizer, config, **engine_kw)

    def generate(self, prompts, max_tokens: int, sampling: dict | None = None) -> list:
        res = self.engine.generate(prompts, C.graphc_params(max_tokens, sampling))
        return [r.ttft_s for r in res], sum(len(r.token_ids) for r in res)


def batch_generate(model, tokenizer, prompts, max_tokens: int, sampling: dict | None = None):
    kw = {"completion_batch_size": max(32, len(prompts))}
    if sampling:
        kw["sampler"] = make_sampler(temp=sampling["temperature"], top_p=sampling["top_p"], top_k=sampling["top_k"])
    out = bg(model, tokenizer, prompts, max_tokens=max_tokens, return_token_ids=True, **kw)
    return None, sum(len(t) for t in out.token_ids)


def plain_loop(model, prompts, max_tokens: int, sampling: dict | None = None):
    """mlx-lm's model on its batched KV cache: prefill, then argmax steps, two-deep pipeline."""
    cache, y = C.plain_prefill(model, prompts)
    nxt = C.plain_step(model, cache, y)
    mx.async_eval(nxt)
    n = 0
    for _ in range(max_tokens - 1):
        cur = nxt
        nxt = C.plain_step(model, cache, cur)
        mx.async_eval(nxt)
        cur.tolist()
        n += len(prompts)
    nxt.tolist()
    del cache
    return None, n + len(prompts)


def batchgen_first_tokens(model, prompts) -> tuple[list, int]:
    """BatchGenerator with batch_generate's defaults, one new token each: TTFT per request."""
    gen = BatchGenerator(model, max_tokens=1)
    ttfts, n, _ = C.batchgen_first_times(gen, prompts)
    gen.close()
    return ttfts, n


def plain_first_tokens(model, prompts, chunk: int = 2048) -> tuple[list, int]:
    """The floor: one request after another through mlx-lm's model and KV cache, 2,048-token
    chunks (mlx-lm's prefill step), argmax of the last position. TTFT accumulates."""
    t0, firsts = now(), []
    for p in prompts:
        cache = make_prompt_cache(model)
        x = mx.array([p], dtype=mx.int32)
        while x.shape[1] > chunk:
            model(x[:, :chunk], cache=cache)
            mx.eval([c.state for c in cache])
            x = x[:, chunk:]
        mx.argmax(model(x, cache=cache)[:, -1, :], axis=-1).item()
        firsts.append(now() - t0)
        del cache
    return firsts, len(firsts)


# -- measuring -----------------------------------------------------------------------------------
def _fresh(rng: random.Random, n: int, length: int, vocab: int) -> list:
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def _timed(fn: Callable) -> tuple[float, object]:
    t0 = now()
    out = fn()
    return now() - t0, out


def spread(xs: list) -> dict:
    xs = [x for x in xs if x is not None]
    return {"min": min(xs), "median": median(xs), "max": max(xs), "runs": xs} if xs else {}


def compare(graphc: dict, base: dict, lower_is_better: bool = True) -> dict | None:
    """Ratio of medians (above 1: graphc ahead) and whether the spread swamps the difference."""
    if not graphc or not base:
        return None
    g, b = graphc["median"], base["median"]
    ratio = (b / g) if lower_is_better else (g / b)
    noise = max(graphc["max"] - graphc["min"], base["max"] - base["min"])
    # A steady time at or below zero means the long call was not slower than the short one:
    # nothing but noise (too few tokens between them for this device).
    bad = g <= 0 or b <= 0
    return {"ratio": ratio, "difference": abs(g - b), "spread": noise, "noise": bad or noise > abs(g - b)}


def run_user_api(model, tokenizer, config, cfg: UserConfig, log: Callable[[str], None] = print,
                 rows: list | None = None) -> dict:
    """Every case of `cfg`; each finished case's row is appended to `rows` (given: the caller can
    print it, and what finished when a run is interrupted) and `log` gets a line for it."""
    if cfg.repeats < 3:
        raise ValueError(f"--user-repeats must be at least 3 to report min/median/max, got {cfg.repeats}")
    if cfg.long_new <= cfg.short_new:
        raise ValueError(f"--long-new ({cfg.long_new}) must be larger than --short-new ({cfg.short_new})")
    rng = random.Random(cfg.seed)
    vocab = int(config["vocab_size"])
    rows = [] if rows is None else rows
    notes = []
    wl = set(cfg.workloads)
    if "grounded" in wl:  # speculative decoding on a copy-the-input task (benchmarks/grounded.py)

        got, notes = run_grounded(model, tokenizer, config, cfg, log, spread=spread, compare=compare)
        rows.extend(got)
        if not wl - {"grounded"}:
            C.free()
            return {"user_api": attrs.asdict(cfg), "rows": rows, "notes": notes}
    graphc = GraphcUser(model, tokenizer, config)
    compiled = GraphcUser(model, tokenizer, config, compile=True) if cfg.compile else None
    auto = GraphcUser(model, tokenizer, config, compile="auto") if cfg.compile else None
    measured = GraphcUser(model, tokenizer, config, compile="measured") if cfg.compile and cfg.measured else None
    skinny = None
    if cfg.compile and cfg.skinny:
        why = skinny_matmul.check()  # where the kernel does not serve, the Engine would be graphc_auto again
        if why is None:
            skinny = GraphcUser(model, tokenizer, config, compile="auto", skinny_gemm=True)
        else:
            notes.append(f"graphc_skinny not measured: the skinny matmul kernel is off here ({why})")
    contestants: dict[str, Callable] = {
        "graphc": lambda ps, n, s=None: graphc.generate(ps, n, s),
        "batch_generate": lambda ps, n, s=None: batch_generate(model, tokenizer, ps, n, s),
    }
    if compiled is not None:
        contestants["graphc_compiled"] = lambda ps, n, s=None: compiled.generate(ps, n, s)
        contestants["graphc_auto"] = lambda ps, n, s=None: auto.generate(ps, n, s)
    if measured is not None:
        contestants["graphc_measured"] = lambda ps, n, s=None: measured.generate(ps, n, s)
    if skinny is not None:
        contestants["graphc_skinny"] = lambda ps, n, s=None: skinny.generate(ps, n, s)
    contestants["plain"] = lambda ps, n, s=None: plain_loop(model, ps, n)
    k = cfg.long_new - cfg.short_new

    cases = []
    if "decode" in wl:
        cases += [(B, None) for B in cfg.batches]
    if "sampled" in wl:
        cases += [(B, SAMPLING) for B in cfg.batches]
    for B, samp in cases:
        # (label, contestant, sampling): the sampled case pairs graphc sampled with graphc greedy
        runs = ([(n, n, None) for n in contestants] if samp is None else
                [("graphc", "graphc", samp), ("graphc_greedy", "graphc", None), ("batch_generate", "batch_generate", samp)])
        names = [label for label, _, _ in runs]
        for _, name, s_ in runs:  # warm-up as long as the long call: kernels, every compiled trace, cache growth
            contestants[name](_fresh(rng, B, cfg.prompt_len, vocab), cfg.long_new, s_)
        steady: dict = {n: [] for n in names}
        # sampled: the median decode step of graphc's long calls, sampled and greedy
        timer = instrument(graphc.engine) if samp is not None else None
        per_step: dict = {"graphc": [], "graphc_greedy": []}
        try:
            for r in range(cfg.repeats):
                for label, name, s_ in runs:  # interleaved, so drift spreads over every contestant
                    t_s, (_, got_s) = _timed(lambda: contestants[name](_fresh(rng, B, cfg.prompt_len, vocab),
                                                                       cfg.short_new, s_))
                    if timer is not None:
                        timer.steps = []
                    t_l, (_, got_l) = _timed(lambda: contestants[name](_fresh(rng, B, cfg.prompt_len, vocab),
                                                                       cfg.long_new, s_))
                    if timer is not None and label in per_step:
                        steps = timer.steps[min(16, cfg.long_new // 4):]  # past the admission and first steps
                        per_step[label].append(median(st["step"] for st in steps) * 1e3 if steps else None)
                    if got_l != B * cfg.long_new or got_s != B * cfg.short_new:
                        notes.append(f"{label} B={B}: generated {got_s} / {got_l} tokens instead of "
                                     f"{B * cfg.short_new} / {B * cfg.long_new} (a stop token?)")
                    steady[label].append((t_l - t_s) * 1e3 / k)
        finally:
            if timer is not None:
                uninstrument(graphc.engine)
        stats = {n: spread(v) for n, v in steady.items()}
        what = "sampled" if samp else "decode"
        row = {"workload": what, "case": f"B={B}", "batch": B, "unit": "ms/step (steady)",
               "values": stats, "tok_per_s": {n: B * 1e3 / s["median"] for n, s in stats.items() if s},
               "ratios": {}}
        for base in ("batch_generate", "plain", "graphc"):
            for g in ("graphc", "graphc_compiled", "graphc_auto", "graphc_measured", "graphc_skinny"):
                if g != base and g in stats and base in stats:
                    c = compare(stats[g], stats[base])
                    if c:
                        row["ratios"][f"{g}/{base}"] = c
        if samp is not None:
            # One ratio per repeat, sampled and greedy measured back to back on one Engine; a
            # non-positive steady time (too few steps for this device) gives no ratio.
            pairs = [s_ / g_ if s_ > 0 and g_ > 0 else None
                     for s_, g_ in zip(steady["graphc"], steady["graphc_greedy"])]
            row["sampled_over_greedy"] = {"graphc": spread(pairs)}
            row["sampled_over_greedy_per_step"] = {"graphc": spread(
                [s_ / g_ if s_ and g_ else None for s_, g_ in zip(per_step["graphc"], per_step["graphc_greedy"])])}
            row["overhead"] = {"graphc": stats["graphc"]["median"] / stats["graphc_greedy"]["median"]}
        rows.append(row)
        log(f"[user-api] {what} B={B}: " + ", ".join(f"{n} {s['median']:.2f} ms" for n, s in stats.items() if s))
    if "sampled" in wl and "decode" in wl:
        greedy = {r["batch"]: r for r in rows if r["workload"] == "decode"}
        for r in [r for r in rows if r["workload"] == "sampled"]:
            g = greedy.get(r["batch"])
            for name in ("batch_generate",):  # graphc's overhead comes from its paired greedy runs
                if g and name in g["values"] and name in r["values"]:
                    # overhead of sampling: sampled ms over greedy ms (1.05 = 5 % over greedy)
                    r.setdefault("overhead", {})[name] = r["values"][name]["median"] / g["values"][name]["median"]

    if "prefill" in wl:
        for n, L in cfg.prefill_cases:
            graphc.generate(_fresh(rng, min(n, 2), L, vocab), 1)  # warm-up at this length
            batchgen_first_tokens(model, _fresh(rng, min(n, 2), L, vocab))
            cached0 = graphc.engine.stats.get("cached_tokens", 0)
            plain_first_tokens(model, _fresh(rng, 1, L, vocab))
            ttft = {"graphc": [], "batchgen": [], "plain": []}
            tps = {"graphc": [], "batchgen": [], "plain": []}
            for r in range(cfg.repeats):
                wall, (firsts, _) = _timed(lambda: graphc.generate(_fresh(rng, n, L, vocab), 1))
                ttft["graphc"].append(median(firsts) * 1e3)
                tps["graphc"].append(n * L / wall)
                wall, (firsts, _) = _timed(lambda: batchgen_first_tokens(model, _fresh(rng, n, L, vocab)))
                ttft["batchgen"].append(median(firsts) * 1e3)
                tps["batchgen"].append(n * L / wall)
                wall, (firsts, _) = _timed(lambda: plain_first_tokens(model, _fresh(rng, n, L, vocab)))
                ttft["plain"].append(median(firsts) * 1e3)
                tps["plain"].append(n * L / wall)
            cached = graphc.engine.stats.get("cached_tokens", 0) - cached0
            if cached:  # random prompts over a small vocabulary share first tokens by chance
                notes.append(f"prefill {n}x{L}: {cached} of {cfg.repeats * n * L} prompt tokens came from the "
                             f"prefix cache (vocabulary {vocab})")
            for unit, vals, lower in (("TTFT ms (median)", ttft, True), ("prompt tok/s", tps, False)):
                stats = {k_: spread(v) for k_, v in vals.items()}
                rows.append({"workload": "prefill", "case": f"{n}x{L}", "batch": n, "unit": unit,
                             "values": stats, "lower_is_better": lower,
                             "ratios": {"graphc/batchgen": compare(stats["graphc"], stats["batchgen"], lower),
                                        "graphc/plain": compare(stats["graphc"], stats["plain"], lower)}})
            log(f"[user-api] prefill {n}x{L}: TTFT graphc {median(ttft['graphc']):.1f} ms, "
                f"BatchGenerator {median(ttft['batchgen']):.1f} ms")
    del graphc, compiled, auto, measured, skinny
    C.free()
    return {"user_api": attrs.asdict(cfg), "rows": rows, "notes": notes}


def user_cases(cfg: UserConfig) -> int:
    """How many rows (one `[user-api]` log line each) a run of `cfg` makes: the progress bar's total."""
    wl = set(cfg.workloads)
    return (len(cfg.batches) * (("decode" in wl) + ("sampled" in wl)) + ("grounded" in wl)
            + (len(cfg.prefill_cases) if "prefill" in wl else 0))


def user_tables(result: dict) -> str:
    """Markdown tables: min / median / max per contestant, ratios with their noise flags."""
    out = []
    env = result.get("environment", {})
    out.append(f"graphc bench --user-api — {result.get('model', {}).get('name', '?')} on {env.get('device', '?')} "
               f"(mlx {env.get('mlx', '?')}, mlx-lm {env.get('mlx_lm', '?')})")
    for w in USER_WORKLOADS:
        rows = [r for r in result["rows"] if r["workload"] == w]
        if not rows:
            continue
        out.append(f"\n{w} — {rows[0]['unit']} (min / median / max of {len(next(iter(rows[0]['values'].values()))['runs'])})")
        names = list(dict.fromkeys(n for r in rows for n in r["values"]))
        head = ["case", *names, "ratios (baseline / graphc)" if w != "grounded" else "speculative / plain"] + (["sampled / greedy"] if w == "sampled" else [])
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for r in rows:
            cells = [r["case"] + ("" if w != "prefill" else f" {r['unit']}")]
            for n in names:
                s = r["values"].get(n)
                cells.append(f"{s['min']:.1f} / **{s['median']:.1f}** / {s['max']:.1f}" if s else "—")
            rat = [f"{k} {v['ratio']:.2f}×" + (" (noise)" if v["noise"] else "")
                   for k, v in r["ratios"].items() if v]
            cells.append("; ".join(rat))
            if w == "sampled":
                paired = r.get("sampled_over_greedy", {})
                per_step = r.get("sampled_over_greedy_per_step", {})
                cells.append("; ".join(
                    f"{k} {v:.3f}" + (f" (paired {paired[k]['min']:.3f} / **{paired[k]['median']:.3f}** / "
                                      f"{paired[k]['max']:.3f})" if paired.get(k) else "")
                    + (f", per step {per_step[k]['min']:.3f} / **{per_step[k]['median']:.3f}** / "
                       f"{per_step[k]['max']:.3f}" if per_step.get(k) else "")
                    for k, v in r.get("overhead", {}).items()))
            if w == "grounded":
                cells[-1] += (f"; acceptance {r['acceptance']:.2f}, {r['tokens_per_verify_step']:.2f} tok/verify step, "
                              f"{r['new_tokens']:.0f} new tok/row")
            out.append("| " + " | ".join(cells) + " |")
    for n in result.get("notes", []):
        out.append(f"note: {n}")
    return "\n".join(out)
