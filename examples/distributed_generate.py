"""Tensor-parallel generation from a script (docs/distributed.md).

    # two ranks on this host (ring backend over loopback):
    mlx.launch -n 2 --backend ring $(which python) examples/distributed_generate.py --model DIR
    # the same script on one process, for comparison:
    python examples/distributed_generate.py --model DIR

Every rank runs this file. `Engine.load(..., distributed=True)` shards the model over the
world group; it returns the engine on rank 0 only — the other ranks follow rank 0's steps
inside it and exit when rank 0 is done — so everything after it runs on rank 0.
"""

from __future__ import annotations

import argparse
import time

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.distributed import launched


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="model folder (default: the built-in demo model)")
    ap.add_argument("--batch", type=int, default=8, help="prompts decoded together")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs (the best is reported)")
    args = ap.parse_args()

    engine = Engine.load(args.model, distributed=launched())
    ranks = getattr(engine, "world_size", 1)
    prompts = [f"Once upon a time, story {i}:" for i in range(args.batch)]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    engine.generate(prompts[:1], SamplingParams(max_tokens=4))  # warm-up
    best = None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        results = engine.generate(prompts, params)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    tokens = sum(len(r.token_ids) for r in results)
    print(f"{ranks} rank(s): batch {args.batch}, {tokens} tokens in {best:.3f} s = {tokens / best:.1f} tokens/s")
    print(f"first: {results[0].text!r}")


if __name__ == "__main__":
    main()
