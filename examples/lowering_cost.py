"""What the generic lowering (the model's own forward) costs against the fast path, on one model.

    graphc make-model --arch llama --out /tmp/llama-256 --hidden-size 256 --num-layers 4 \
        --num-heads 8 --num-kv-heads 4 --intermediate-size 512
    python examples/lowering_cost.py /tmp/llama-256 --repeats 9

Both engines load the same folder (lowering="fast" and lowering="generic") and alternate
which runs first. Prefill: one 384-token prompt to its first token. Decode: 8 rows of 16
tokens, 64 steps (time of 65 tokens minus time of 1, per step). Prints medians and the
generic/fast time ratio (> 1: the generic path is slower).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from graphc.runtime import Engine, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    engines = {low: Engine.load(args.model, lowering=low, prefill_chunk=512, prefix_cache=False)
               for low in ("fast", "generic")}
    vocab = engines["fast"].vocab_size
    rng = random.Random(0)
    long = [[rng.randrange(3, vocab) for _ in range(384)]]
    short = [[rng.randrange(3, vocab) for _ in range(16)] for _ in range(8)]
    one, many = SamplingParams(max_tokens=1, ignore_eos=True), SamplingParams(max_tokens=65, ignore_eos=True)
    times = {low: {"prefill": [], "decode": []} for low in engines}
    for rep in range(args.repeats):
        order = list(engines.items())
        for low, eng in (order[::-1] if rep % 2 else order):
            t = time.perf_counter()
            eng.generate(long, one)
            times[low]["prefill"].append(time.perf_counter() - t)
            t = time.perf_counter()
            eng.generate(short, one)
            first = time.perf_counter() - t
            t = time.perf_counter()
            eng.generate(short, many)
            times[low]["decode"].append((time.perf_counter() - t - first) / 64)
    for what in ("prefill", "decode"):
        fast, gen = (statistics.median(times[low][what][1:]) for low in ("fast", "generic"))
        print(f"{what}: fast {fast * 1e3:.2f} ms, generic {gen * 1e3:.2f} ms, generic/fast {gen / fast:.2f}")


if __name__ == "__main__":
    main()
