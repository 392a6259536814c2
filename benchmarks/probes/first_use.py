"""Which ops of a serving step pay a first-use cost after `graphc serve`'s warm-up, and for which keys.

Loads the model as `graphc serve` does (its parser and defaults), runs the server's warm-up, then
lets a few rows decode while long prompts arrive one after the other, twice over with the same
lengths (new tokens). Every attention call, linear layer, RoPE and RMS norm is timed alone (its
inputs evaluated and the device synchronized before, its output after), so a call that builds
something (a cuDNN plan, a JIT kernel, a GEMM heuristic) shows as a slow call with its key. The
key of an attention call is (rows, query length, key length, KV buffer capacity, mask) and each
slow one says whether the warm-up ran that key. Timing every op alone changes how a step runs
(no overlap), so only the per-op outliers count, not the step totals.

    python benchmarks/probes/first_use.py --model DIR [--rows 8] [--prompts 3000,1500,2200,700,380+300] [--slow-ms 5]
"""

from __future__ import annotations

import graphc.contracts  # noqa: F401  before mlx.core: MLX sizes its attention plan cache then

import argparse
import collections
import json
import time

import mlx.core as mx
import mlx.nn as nn
from chunk_cost import decoding_rows  # benchmarks/probes/chunk_cost.py (run from this folder's path)

from graphc.runtime import SamplingParams
from graphc.runtime.cache import full as full_cache
from graphc.runtime.server.cli import add_parser, config_from_args  # `graphc serve`'s parser
from graphc.runtime.server.state import load_engine
from graphc.runtime.warmup_plans import attention_plans, batched_plans


class OpClock:
    """Synchronized per-call timers on a few mx functions and nn.Linear; `phase` names who records."""

    def __init__(self, slow_ms: float):
        self.slow_ms, self.phase, self.cap = slow_ms, "load", None
        self.timing = True  # off: keys recorded only (the warm-up runs as the server runs it)
        self.keys = collections.defaultdict(set)  # phase -> attention keys met
        self.slow = []  # (phase, op, key, ms)
        self.undo = []

    def _key(self, op, args, kw):
        if op == "sdpa":
            q, k = args[0], args[1]
            mask = kw.get("mask")
            mk = mask if mask is None or isinstance(mask, str) else f"array{tuple(mask.shape)}"
            return (q.shape[0], q.shape[2], k.shape[2], self.cap, mk)
        return tuple(tuple(a.shape) for a in args if isinstance(a, mx.array))

    def _timed(self, op, fn):
        def call(*args, **kw):
            if not self.timing:
                if op == "sdpa" and args[0].shape[2] > 1:
                    self.keys[self.phase].add(self._key(op, args, kw))
                return fn(*args, **kw)
            mx.eval([a for a in args if isinstance(a, mx.array)])
            mx.synchronize()
            t = time.perf_counter()
            out = fn(*args, **kw)
            mx.eval(out)
            mx.synchronize()
            ms = (time.perf_counter() - t) * 1e3
            key = self._key(op, [a for a in args if not isinstance(a, nn.Module)], kw)
            if op == "sdpa" and args[0].shape[2] > 1:
                self.keys[self.phase].add(key)
            if ms > self.slow_ms:
                self.slow.append((self.phase, op, key, round(ms, 1)))
            return out
        return call

    def install(self):
        for name, op in (("scaled_dot_product_attention", "sdpa"), ("rope", "rope"), ("rms_norm", "rms_norm")):
            orig = getattr(mx.fast, name)
            setattr(mx.fast, name, self._timed(op, orig))
            self.undo.append(lambda n=name, o=orig: setattr(mx.fast, n, o))
        lin = nn.Linear.__call__
        nn.Linear.__call__ = self._timed("linear", lin)
        self.undo.append(lambda: setattr(nn.Linear, "__call__", lin))
        append = full_cache.FullKV.append

        def recorded(cache, new):
            out = append(cache, new)
            self.cap = cache.keys.shape[2]
            return out
        full_cache.FullKV.append = recorded
        self.undo.append(lambda: setattr(full_cache.FullKV, "append", append))

    def uninstall(self):
        for f in reversed(self.undo):
            f()


def traffic(engine, clock, rows, prompts, rounds, seed):
    ids, bg = decoding_rows(engine, rows, seed)
    steps = []
    for r in range(rounds):
        clock.phase = f"round{r}"
        for group in prompts:  # "a+b": prompts that arrive together (a batched prefill)
            rids = [engine.add_request(ids(n), SamplingParams(max_tokens=2, ignore_eos=True)) for n in group]
            while any(engine.request(i) is not None and not engine.request(i).finished for i in rids):
                before = len(clock.slow)
                t = time.perf_counter()
                engine.step()
                steps.append({"round": r, "prompt": "+".join(map(str, group)),
                              "ms": round((time.perf_counter() - t) * 1e3, 1), "slow_ops": clock.slow[before:]})
    for rid in bg:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompts", default="3000,1500,2200,700,380+300", help="prompt lengths, one after the other; a+b arrive together")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--slow-ms", type=float, default=5.0)
    p.add_argument("--serve-args", default="", help="extra `graphc serve` flags")
    p.add_argument("--force-shapes", action="store_true", help="run the GPU's shape warm-up on any device")
    p.add_argument("--json")
    a = p.parse_args(argv)
    serve = argparse.ArgumentParser(prog="graphc")
    add_parser(serve.add_subparsers(dest="command"))
    args = serve.parse_args(["serve", "--model", a.model, *a.serve_args.split()])
    t = time.perf_counter()
    engine = load_engine(config_from_args(args))
    print(f"load {time.perf_counter() - t:.1f} s", flush=True)
    clock = OpClock(a.slow_ms)
    clock.install()
    clock.phase, clock.timing = "warm-up", False
    t = time.perf_counter()
    engine.warm_up(shapes=True)
    if a.force_shapes:  # the GPU's shape warm-up on another device, to check its keys there
        attention_plans(engine, force=True)
        batched_plans(engine, force=True)
    print(f"warm-up {time.perf_counter() - t:.1f} s, {len(clock.keys['warm-up'])} prompt attention keys", flush=True)
    clock.timing = True
    steps = traffic(engine, clock, a.rows, [[int(n) for n in g.split("+")] for g in a.prompts.split(",")], a.rounds, 0)
    clock.uninstall()
    warmed = clock.keys["warm-up"]
    by_phase = collections.defaultdict(lambda: collections.Counter())
    for phase, op, key, ms in clock.slow:
        if phase != "warm-up":
            by_phase[phase][op] += 1
    print("slow ops (>", a.slow_ms, "ms) by round:", {k: dict(v) for k, v in by_phase.items()})
    for s in steps:
        if s["slow_ops"]:
            print(f"round {s['round']} prompt {s['prompt']} step {s['ms']} ms:")
            for phase, op, key, ms in s["slow_ops"]:
                seen = f" (warm-up ran it: {key in warmed})" if op == "sdpa" else ""
                print(f"    {op} {key} {ms} ms{seen}")
    for r in range(a.rounds):
        met = clock.keys[f"round{r}"]
        print(f"round {r}: {len(met)} prompt attention keys, {len(met - warmed)} not in the warm-up's:",
              sorted(met - warmed, key=str)[:20])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": steps, "warmed": sorted(map(str, warmed))}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
