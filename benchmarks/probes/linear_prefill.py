"""A prompt's prefill on a gated-delta hybrid (qwen3_next): the chunked recurrence against mlx-lm's
per-position loop (the prefill plan's "linear attention (prompt chunks)" choice,
compiler/passes/prefill_choices.py).

Two engines on one model, forced `linear_prefill="chunked"` and `"mlx-lm"`; each measurement is
one fresh prompt of L tokens as one chunk through the compiled prefill step (forward, head, the
sampled token read, every cache write evaluated), the arms alternated, median / min / max kept.
Also printed: the largest |difference| of the two arms' last-position logits, and whether their
sampled tokens agree.

    python benchmarks/probes/linear_prefill.py --model DIR|SHAPE [--layers 4] [--dtype float32]
        [--lengths 512,2048] [--repeats 5] [--json OUT]

--layers cuts a shape (benchmarks/shapes.py, e.g. qwen3-next-2b) to its first N layers: the
gated-delta layers keep their heads and dims, the ratio of linear to full layers stays 3:1.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import mlx.core as mx

from graphc.benchmarks.env import environment
from graphc.benchmarks.shapes import SHAPES, IdTokenizer, random_model
from graphc.compiler.lower import StepInputs, cache_arrays
from graphc.runtime import Engine

ARMS = ("chunked", "mlx-lm")
CHOICE = "linear attention (prompt chunks)"


def engines(a) -> dict:
    if a.model in SHAPES:
        cfg = dict(SHAPES[a.model])
        if a.layers:
            cfg["num_hidden_layers"] = a.layers
        model = random_model(cfg, getattr(mx, a.dtype))
        return {arm: Engine(model, IdTokenizer(), cfg, linear_prefill=arm, prefix_cache=False,
                            prefill_chunk=max(a.lengths)) for arm in ARMS}
    return {arm: Engine.load(a.model, linear_prefill=arm, prefix_cache=False, prefill_chunk=max(a.lengths))
            for arm in ARMS}


def prefill(engine, prompt: list) -> tuple:
    step, caches = engine.compiled.prefill, engine.runner.new_caches()
    t = time.perf_counter()
    ctx = step.forward(StepInputs(mx.array(prompt, dtype=mx.int32)[None], caches, final=True))
    out = step.head(ctx)
    mx.eval(out.next_tokens, *cache_arrays(caches))
    return (time.perf_counter() - t) * 1e3, out.logits.astype(mx.float32), int(out.next_tokens[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a model folder or a shape name (benchmarks/shapes.py)")
    ap.add_argument("--layers", type=int, default=None, help="a shape's first N layers only")
    ap.add_argument("--dtype", default="float32", help="a shape's weights")
    ap.add_argument("--lengths", default="512,2048")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    a.lengths = [int(n) for n in a.lengths.split(",")]
    engs = engines(a)
    for arm, eng in engs.items():
        assert eng.compiled.prefill.plan.choice(CHOICE).choice == arm, eng.compiled.prefill.plan.choice(CHOICE)
    vocab = next(iter(engs.values())).vocab_size
    rng = random.Random(0)
    rows = []
    for n in a.lengths:
        times = {arm: [] for arm in ARMS}
        for eng in engs.values():  # warm: first shapes
            prefill(eng, [rng.randrange(3, vocab) for _ in range(n)])
        diff, agree = 0.0, 0
        for _ in range(a.repeats):
            prompt = [rng.randrange(3, vocab) for _ in range(n)]
            out = {}
            for arm, eng in engs.items():
                ms, logits, tok = prefill(eng, prompt)
                times[arm].append(ms)
                out[arm] = (logits, tok)
            diff = max(diff, mx.abs(out["chunked"][0] - out["mlx-lm"][0]).max().item())
            agree += out["chunked"][1] == out["mlx-lm"][1]
        row = {"tokens": n, "max_abs_logit_diff": diff, "tokens_agree": f"{agree}/{a.repeats}"}
        for arm in ARMS:
            ts = times[arm]
            row[arm] = {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts)}
        row["loop_over_chunked"] = row["mlx-lm"]["median_ms"] / row["chunked"]["median_ms"]
        rows.append(row)
        print(f"{n:6d} tokens: chunked {row['chunked']['median_ms']:9.1f} ms "
              f"({row['chunked']['min_ms']:.1f}-{row['chunked']['max_ms']:.1f}), mlx-lm loop "
              f"{row['mlx-lm']['median_ms']:9.1f} ms ({row['mlx-lm']['min_ms']:.1f}-{row['mlx-lm']['max_ms']:.1f}), "
              f"loop/chunked {row['loop_over_chunked']:.2f}x; max |logit diff| {diff:.2e}, tokens agree {agree}/{a.repeats}",
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "layers": a.layers, "dtype": a.dtype, "repeats": a.repeats,
                       "env": environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
