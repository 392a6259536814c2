"""Which GPU kernels a steady decode step spends its device time in: eager against compiled.

Run under Nsight Compute with profiling off until the script turns it on, e.g.
  ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw \
      --log-file k.csv python3 docs/bench/proto_kernel_profile.py llama-3.1-8b 64 '{"compile": true}'
  python3 docs/bench/proto_kernel_profile.py --sum k.csv
One Engine, B fresh prompts of 128 tokens; a warm-up generate (kernels built, capacities
grown), then a second generate whose decode steps `first`..`first + steps` run between
cudaProfilerStart and cudaProfilerStop (the runner's decode is wrapped), so the capture holds
steady decode steps only. `--sum` aggregates ncu's CSV: device µs per step by kernel name.
Usage: proto_kernel_profile.py SHAPE B ENGINE_KW_JSON [first steps [SAMPLING_JSON]] | --sum CSV [steps]
SAMPLING_JSON (e.g. '{"temperature": 0.8, "top_p": 0.9, "top_k": 50}') profiles sampled steps:
against a greedy profile, the kernels a sampled step adds.
PROTO_HOST_COPY=1 (run 21): the host reads a copy of each step's tokens, and the next step's
embedding lookup indexes the original, which the host then never reads. MLX's CUDA allocator
moves a buffer the host reads into managed memory; if the in-step lookup's ~250 µs comes from
that, this variant's gather is back at the 4 µs it costs alone.
"""

import ctypes
import ctypes.util
import glob
import json
import sys
import time

import mlx.core as mx

from graphc.benchmarks.contestants import graphc_params, make_engine
from graphc.benchmarks.shapes import load_shape


def cudart():
    """libcudart for cudaProfilerStart/Stop: the system's or a pip wheel's."""
    names = [ctypes.util.find_library("cudart")] + sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so*")) \
        + sorted(glob.glob("/root/site/nvidia/*/lib/libcudart.so*")) + ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    for n in names:
        if n:
            try:
                return ctypes.CDLL(n)
            except OSError:
                pass
    return None


def summarize(path: str, steps: int) -> None:
    import csv
    rows = [r for r in csv.DictReader(l for l in open(path) if l.startswith('"'))]
    tot: dict = {}
    cnt: dict = {}
    scale = 1e-3  # ncu's raw page has a units row ("nsecond", "usecond", "msecond")
    for r in rows:
        unit = r.get("gpu__time_duration.sum", "")
        if unit in ("nsecond", "usecond", "msecond", "second"):
            scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}[unit]
            continue
        try:
            us = float(unit.replace(",", "")) * scale
        except (KeyError, ValueError):
            continue
        name = r.get("Kernel Name", "?")[:90]
        tot[name] = tot.get(name, 0.0) + us
        cnt[name] = cnt.get(name, 0) + 1
    all_us = sum(tot.values())
    print(f"{path}: {sum(cnt.values())} kernels, {all_us / steps:.0f} µs of device time per step over {steps} steps")
    for name, us in sorted(tot.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {us / steps:8.1f} µs/step  {cnt[name] / steps:6.1f} launches/step  {name}")


if sys.argv[1] == "--sum":
    summarize(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 4)
    sys.exit(0)
shape, B = sys.argv[1], int(sys.argv[2])
kw = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
first = int(sys.argv[4]) if len(sys.argv) > 4 else 16
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 4
sampling = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None
model, tok, cfg, label = load_shape(shape, "bfloat16")
eng = make_engine(model, tok, cfg, **kw)
prompts = [[3 + (i * 131 + j * 7) % (eng.vocab_size - 3) for j in range(128)] for i in range(B)]
eng.generate(prompts, graphc_params(first + steps + 8, sampling))
lib = cudart()
print(f"{label} B={B} {kw}: cudart {'found' if lib else 'NOT found'}", flush=True)
runner = eng.runner
decode = runner.decode
if __import__("os").environ.get("PROTO_HOST_COPY") == "1":
    launch0, next0, dev = runner._launch, runner._next_input, {}

    def launch_copy():
        lz = launch0()
        dev.clear()
        dev[id(lz)] = lz.tokens
        lz.tokens = lz.tokens + 0  # what the host reads
        mx.async_eval(lz.tokens)
        return lz

    def next_input_dev():
        p = runner.pending
        if p is None or id(p) not in dev:
            return next0()
        host, p.tokens = p.tokens, dev[id(p)]
        try:
            return next0()
        finally:
            p.tokens = host

    runner._launch, runner._next_input = launch_copy, next_input_dev
    print("PROTO_HOST_COPY: the host reads a copy of each step's tokens", flush=True)
seen = {"n": 0, "t": 0.0}


def wrapped(*a, **k):
    n = seen["n"]
    if n == first:
        mx.synchronize()
        lib and lib.cudaProfilerStart()
        seen["t"] = time.perf_counter()
    r = decode(*a, **k)
    if n == first + steps - 1:
        mx.synchronize()
        seen["t"] = time.perf_counter() - seen["t"]
        lib and lib.cudaProfilerStop()
    seen["n"] = n + 1
    return r


runner.decode = wrapped
prompts = [[3 + (i * 137 + j * 11) % (eng.vocab_size - 3) for j in range(128)] for i in range(B)]
eng.generate(prompts, graphc_params(first + steps + 8, sampling))
print(f"{label} B={B} {kw} {sampling or 'greedy'}: {steps} profiled decode steps, {seen['t'] * 1e3 / steps:.1f} ms/step under the profiler", flush=True)
