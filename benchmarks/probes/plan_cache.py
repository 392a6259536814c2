"""Does MLX keep its CUDA attention plans per thread, and how many does the main thread keep?

1. One attention shape built on the main thread, then run on a new thread: a build again there
   (tens of ms) means the plans are per thread, so a warm-up must run on the thread that serves.
2. `--shapes` distinct shapes built on the main thread, then the first ones run again: fast means
   the cache holds them all (graphc's 2,048, contracts/mlx_env.py), slow means they were evicted
   (MLX's default 256 when the variable is set after mlx.core is imported). The process's
   resident memory and MLX's device memory before and after say what each kept plan costs, the
   price of a larger cache.

    python benchmarks/probes/plan_cache.py [--shapes 300]
"""

from __future__ import annotations

import graphc.contracts  # noqa: F401  before mlx.core, as every graphc entry point does

import argparse
import os
import resource
import threading
import time

import mlx.core as mx


def attend_ms(length: int) -> float:
    q = mx.zeros((1, 8, length, 64), dtype=mx.bfloat16)
    mx.eval(q)
    mx.synchronize()
    t = time.perf_counter()
    mx.eval(mx.fast.scaled_dot_product_attention(q, q, q, scale=0.125, mask="causal"))
    mx.synchronize()
    return round((time.perf_counter() - t) * 1e3, 2)


def _rss_mib() -> float:
    """This process's resident set now (Linux /proc), else its peak."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", type=int, default=300)
    a = p.parse_args(argv)
    print("MLX_CUDA_SDPA_CACHE_SIZE", os.environ.get("MLX_CUDA_SDPA_CACHE_SIZE"), "device", mx.default_device())
    first = attend_ms(136)
    again = attend_ms(136)
    other = []
    t = threading.Thread(target=lambda: other.append(attend_ms(136)))
    t.start()
    t.join()
    print(f"one shape: first {first} ms, again {again} ms, on a new thread {other[0]} ms "
          f"({'per thread' if other[0] > 5 * max(again, 0.05) else 'shared'})")
    lengths = [128 + 8 * i for i in range(a.shapes)]
    rss0, dev0 = _rss_mib(), mx.get_active_memory() / 2**20
    t0 = time.perf_counter()
    for n in lengths:
        attend_ms(n)
    built = time.perf_counter() - t0
    rss1, dev1 = _rss_mib(), mx.get_active_memory() / 2**20
    back = [attend_ms(n) for n in lengths[:5]]
    print(f"{a.shapes} shapes built in {built:.1f} s; the first five again: {back} ms")
    print(f"resident memory {rss0:.0f} -> {rss1:.0f} MiB ({(rss1 - rss0) * 1024 / a.shapes:.0f} KiB a plan), "
          f"MLX active device memory {dev0:.0f} -> {dev1:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
