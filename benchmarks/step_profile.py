"""Where a decode step's wall time goes, through the public API: `python -m graphc.benchmarks.step_profile`.

`Engine.generate` on B fresh prompts (GC on, chain on, defaults), with timers around the
runner's parts. For every steady decode step (the first `--skip` are dropped) it records:

  build    Python builds the lazy step (forward + head)           - host
  submit   `mx.async_eval` of that step: on MLX's CUDA backend the   - host
           kernels are encoded and launched here
  wait     the previous step's `tolist()`: the host waits for the   - device time the host
           device                                                      did not cover
  engine   Engine.step outside the runner's decode (scheduler,     - host
           stop checks, detokenizing, results)

and the wall time of the step. The same split is taken for mlx-lm's plain loop (batched KV
cache, argmax, two-deep pipeline) on the same model and prompts. A step whose `wait` is near
zero is host-bound: the GPU finished before the host asked; then only less host work per step
(fewer ops to encode, less Python) makes it faster. A step with a large `wait` is device-bound.

The timers wrap methods of the runner and add a few µs per step; the ms/step they report is
compared with an untimed `generate` call in the same process.

`--paired SAMPLING_JSON` measures what sampling costs per step instead: greedy and sampled
calls alternate on one Engine and each pair gives a ratio of per-step medians, e.g.
  python -m graphc.benchmarks.step_profile --model llama-3.2-1b --batch 64 --repeats 9 \
      --paired '{"temperature": 0.8, "top_p": 0.9, "top_k": 50}'
`--control` adds mlx-lm's plain loop after every call and a ratio normalized by it: the host's
own speed moves between calls, and a host-bound step moves with it. Each ratio's
summary ends with a distribution-free 95 % interval of its median (order statistics; 6 pairs at
least) and what it shows against `--limit` (default 0.05: "sampling at most 5 % over greedy"):
shown, the opposite shown, or not resolved. `--budget SECONDS` starts no new pair once that
much time has passed since the start (model load included) and reports the pairs done, marked
as cut: under a device call's time limit a run otherwise loses them all.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from math import comb
from statistics import median

import mlx.core as mx

from .contestants import graphc_params, make_engine, plain_prefill
from .shapes import load_shape

now = time.perf_counter
PARTS = ("build", "submit", "wait", "engine", "step")


class _Timer:
    """Per-step sums of the parts, keyed by decode step index; `other`: the wall time of each
    engine step that decoded nothing (admission and prefill only)."""

    def __init__(self):
        self.steps: list[dict] = []
        self.other: list[float] = []
        self.cur: dict = {}

    def add(self, part: str, dt: float):
        self.cur[part] = self.cur.get(part, 0.0) + dt

    def close(self, wall: float, decoded: bool):
        if decoded:
            self.cur["step"] = wall
            self.steps.append(self.cur)
        else:
            self.other.append(wall)
        self.cur = {}


def instrument(engine) -> _Timer:
    """Wrap engine.step and its runner's decode, _launch, forward and head (instance attributes,
    so the engine is otherwise unchanged)."""
    t = _Timer()
    runner = engine.runner
    step = runner.compiled.decode
    fwd, head, launch, decode, estep = step.forward, step.head, runner._launch, runner.decode, engine.step
    state = {"decoded": False, "in_launch": 0.0}

    def forward(*a, **k):
        t0 = now(); r = fwd(*a, **k); t.add("build", now() - t0); return r  # noqa: E702

    def head_(*a, **k):
        t0 = now(); r = head(*a, **k); t.add("build", now() - t0); return r  # noqa: E702

    def launch_(*a, **k):
        b0 = t.cur.get("build", 0.0)
        t0 = now()
        r = launch(*a, **k)
        dt = now() - t0
        t.add("submit", dt - (t.cur.get("build", 0.0) - b0))
        state["in_launch"] += dt
        return r

    def decode_(*a, **k):
        state["decoded"] = True
        state["in_launch"] = 0.0
        t0 = now()
        r = decode(*a, **k)
        dt = now() - t0
        t.add("wait", dt - state["in_launch"])  # decode = launch of the next step + tolist
        t.add("_decode", dt)
        return r

    def estep_(*a, **k):
        state["decoded"] = False
        t0 = now()
        r = estep(*a, **k)
        wall = now() - t0
        t.add("engine", wall - t.cur.get("_decode", 0.0))
        t.close(wall, state["decoded"])
        return r

    step.forward, step.head, runner._launch, runner.decode, engine.step = forward, head_, launch_, decode_, estep_
    return t


def uninstrument(engine) -> None:
    """Remove `instrument`'s wrappers: the engine's methods are its classes' again."""
    del engine.step, engine.runner._launch, engine.runner.decode
    del engine.runner.compiled.decode.forward, engine.runner.compiled.decode.head


def plain_loop(model, prompts, new: int, skip: int) -> list[dict]:
    """mlx-lm's plain loop with the same split (build, submit, wait; no engine part)."""
    cache, y = plain_prefill(model, prompts)
    nxt = mx.argmax(model(y[:, None], cache=cache)[:, -1, :], axis=-1)
    mx.async_eval(nxt)
    rows = []
    for i in range(new):
        t0 = now()
        cur = nxt
        nxt = mx.argmax(model(cur[:, None], cache=cache)[:, -1, :], axis=-1)
        t1 = now()
        mx.async_eval(nxt)
        t2 = now()
        cur.tolist()
        t3 = now()
        if i >= skip:
            rows.append({"build": t1 - t0, "submit": t2 - t1, "wait": t3 - t2, "engine": 0.0, "step": t3 - t0})
    mx.eval(nxt)
    return rows


def _clock() -> float:
    return time.monotonic()


def summarize(rows: list[dict]) -> dict:
    return {p: round(median(r.get(p, 0.0) for r in rows) * 1e3, 3) for p in PARTS} | {"steps": len(rows)}


def paired(eng, rng, vocab: int, B: int, args, sampling: dict, model=None) -> dict:
    """Greedy and sampled calls of B fresh prompts alternated on one Engine, `args.repeats` pairs:
    each call's median steady step (ms) and each pair's sampled / greedy ratio. A per-step median
    leaves out admission steps and stalls, which the call-level (T144 - T16) / 128 of
    `graphc bench --user-api` carries; that is what makes a 5 % difference resolvable.

    With `args.control` (and `model`), mlx-lm's plain loop runs right after every call on B fresh
    prompts of its own, and each call's step is also taken relative to that control's:
    `normalized` = (sampled / its control) / (greedy / its control). The host's own speed can move
    between calls of one process (on the H200 the plain loop's build went from 0.86 to 1.30 ms), which
    moves a host-bound step with it; the control moves too, and the normalized ratio cancels it."""
    kinds = {"greedy": graphc_params(args.new), "sampled": graphc_params(args.new, sampling)}
    control = bool(getattr(args, "control", False)) and model is not None

    def call(kind):
        eng.generate([[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(B)], kinds[kind])

    def plain() -> float:
        prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(B)]
        return summarize(plain_loop(model, prompts, args.new, args.skip))["step"]

    deadline = getattr(args, "deadline", None)
    for kind in kinds:  # warm-up: kernels built, traces, pool allocated
        call(kind)
    if control:
        plain()
    timer = instrument(eng)
    res = {"batch": B, "greedy": [], "sampled": [], "ratio": []}
    if control:
        res.update(greedy_control=[], sampled_control=[], normalized=[])
    try:
        for r in range(args.repeats):
            if deadline is not None and _clock() > deadline:  # --budget: a cut by time, not by results
                res["cut"] = f"after {r} of {args.repeats} pairs (--budget {args.budget:g} s)"
                print(f"B={B:3d} {res['cut']}", flush=True)
                break
            for kind in (("greedy", "sampled") if r % 2 == 0 else ("sampled", "greedy")):
                gc.collect()
                timer.steps = []
                call(kind)
                res[kind].append(summarize(timer.steps[args.skip:])["step"])
                if control:
                    res[kind + "_control"].append(plain())
            res["ratio"].append(round(res["sampled"][-1] / res["greedy"][-1], 4))
            line = (f"B={B:3d} pair {r}: greedy {res['greedy'][-1]:.3f} ms/step, sampled {res['sampled'][-1]:.3f}, "
                    f"sampled / greedy {res['ratio'][-1]:.3f}")
            if control:
                gc_, sc_ = res["greedy_control"][-1], res["sampled_control"][-1]
                res["normalized"].append(round(res["ratio"][-1] * gc_ / sc_, 4))
                line += f"; plain after each {gc_:.3f} / {sc_:.3f}, normalized {res['normalized'][-1]:.3f}"
            print(line, flush=True)
    finally:
        uninstrument(eng)
    for name in ("ratio", "normalized") if control else ("ratio",):
        rs = sorted(res[name])
        if not rs:
            res[f"{name}_verdict"] = "not resolved (no pairs)"
            print(f"B={B:3d} no pairs", flush=True)
            continue
        res[f"{name}_min_median_max"] = [rs[0], round(median(rs), 4), rs[-1]]
        ci = median_interval(rs)
        res[f"{name}_median_95"] = list(ci) if ci else None
        verdict = against(ci, getattr(args, "limit", 0.05))
        res[f"{name}_verdict"] = verdict
        what = "sampled / greedy" if name == "ratio" else "normalized by the plain loop"
        band = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "(too few pairs)"
        print(f"B={B:3d} {what} per-step median over {len(rs)} pairs: min {rs[0]:.3f} / median {median(rs):.3f} "
              f"/ max {rs[-1]:.3f}; 95 % interval of the median {band}: {verdict}", flush=True)
    return res


def median_interval(values, confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of `values` (sorted order statistics): the
    k-th smallest and k-th largest, with the largest k whose binomial coverage P(k <= X <= n - k),
    X ~ Bin(n, 1/2), is still at least `confidence`. It assumes only independent pairs, not a
    shape of the noise (the host's speed swings are not normal). None below 6 pairs, where no k
    reaches 95 %."""
    rs, n = sorted(values), len(values)
    best = None
    for k in range(1, n // 2 + 1):
        cover = sum(comb(n, i) for i in range(k, n - k + 1)) / 2**n
        if cover < confidence:
            break
        best = k
    return None if best is None else (rs[best - 1], rs[n - best])


def against(ci, limit: float) -> str:
    """What an interval of sampled / greedy shows about "at most `limit` over greedy"."""
    if ci is None:
        return "not resolved (too few pairs)"
    if ci[1] <= 1 + limit:
        return f"<= {limit:.0%} over greedy shown"
    if ci[0] > 1 + limit:
        return f"> {limit:.0%} over greedy shown"
    return f"not resolved at {limit:.0%}"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m graphc.benchmarks.step_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="a bench shape (llama-3.1-8b, llama-3.2-1b, tiny) or a model folder")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, nargs="+", default=[64])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=144, help="new tokens per request")
    ap.add_argument("--skip", type=int, default=16, help="first decode steps left out (warm-up, joins)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine-kw", default="{}", help='JSON of extra Engine options, e.g. {"compile": true}')
    ap.add_argument("--sampling", default="{}", help='JSON of SamplingParams fields for every request, e.g. '
                    '{"temperature": 0.8, "top_p": 0.9, "top_k": 50} (default: greedy)')
    ap.add_argument("--paired", metavar="SAMPLING_JSON",
                    help="instead of the split against the plain loop: alternate greedy calls and calls with these "
                    "SamplingParams fields on one Engine (the order flips every repeat, so drift falls on both) and "
                    "report each call's per-step median and the sampled / greedy ratio of each pair")
    ap.add_argument("--control", action="store_true",
                    help="with --paired: run mlx-lm's plain loop after every call and also report each pair's ratio "
                    "normalized by it (the host's speed moves between calls; the control moves with it)")
    ap.add_argument("--limit", type=float, default=0.05,
                    help="with --paired: the overhead the 95 %% interval of the median ratio is judged against "
                    "(issue 15: sampling at most 5 %% over greedy)")
    ap.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                    help="with --paired: start no new pair after this many seconds from the start (model load "
                    "included) and report the pairs done, marked as cut; for a device call with a time limit, "
                    "which would otherwise lose every result")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    args.deadline = None if args.budget is None else _clock() + args.budget

    model, tokenizer, config, label = load_shape(args.model, args.dtype)
    eng = make_engine(model, tokenizer, config, **json.loads(args.engine_kw))
    rng = random.Random(0)
    vocab = eng.vocab_size
    out = {"model": label, "engine_kw": json.loads(args.engine_kw), "sampling": json.loads(args.sampling), "runs": []}
    if args.paired:
        out["paired"] = json.loads(args.paired)
        out["pairs"] = [paired(eng, rng, vocab, B, args, out["paired"], model) for B in args.batch]
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return out
    for B in args.batch:
        def prompts():
            return [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(B)]

        params = graphc_params(args.new, json.loads(args.sampling))
        eng.generate(prompts(), params)  # warm-up: kernels built, pool allocated
        timer = instrument(eng)
        for r in range(args.repeats):
            gc.collect()
            timer.steps = []
            t0 = now()
            eng.generate(prompts(), params)
            wall = now() - t0
            g = summarize(timer.steps[args.skip:])
            p = summarize(plain_loop(model, prompts(), args.new, args.skip))
            row = {"batch": B, "repeat": r, "graphc": g, "plain": p, "graphc_call_s": round(wall, 3)}
            out["runs"].append(row)
            print(f"B={B:3d} r{r}  " + "  ".join(
                f"{who}: " + " ".join(f"{k} {d[k]:.2f}" for k in PARTS) for who, d in (("graphc", g), ("plain", p))),
                flush=True)
        uninstrument(eng)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
