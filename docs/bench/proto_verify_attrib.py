"""Where graphc's verify step spends host time, against mlx-lm's own forward, in ONE process.

1. mlx-lm's model + KVCache, L = 1 and 9 new positions, build (Python graph + async_eval) and
   wait: (a) the cache trimmed back every repeat (constant KV length: what proto_verify_cost.py
   timed), (b) the cache growing by 4 per repeat (what a real verify sees).
2. Per-op host cost on this device (build + async_eval of one op, median of 200): matmul at
   M = 1 / 9 (gemv vs cuBLAS), quantized matmul at M = 1 / 9, SDPA at L = 1 / 9.
3. graphc's Engine, batch 1, the grounded workload: plain, speculative with the verify
   attention kernel (runtime/kernel_views.py) and without it, interleaved:
   tokens/s and the ms per verify step split into draft / graph (Python) / encode
   (mx.async_eval) / wait / post.
Usage: proto_verify_attrib.py MODEL [reps]  (DEQUANTIZE=1: the weights as bf16; PARTS=graphc:
part 3 only)."""

import os
import statistics
import sys
import time

import mlx.core as mx

from graphc.compiler.gguf import resolve_model_path
from graphc.runtime import Engine, SamplingParams
from graphc.benchmarks.grounded import grounded_prompts
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

src = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
path = str(resolve_model_path(src) if src.endswith(".gguf") else src)
deq = bool(os.environ.get("DEQUANTIZE"))
parts = os.environ.get("PARTS", "mlx,graphc").split(",")


def dequant(model):
    if deq:
        from mlx_lm.utils import dequantize_model
        dequantize_model(model)
        model.set_dtype(mx.bfloat16)


def med(x):
    return statistics.median(x)


if "mlx" in parts:
    # 1. mlx-lm's forward
    model, _ = load(path)
    dequant(model)
    prompt = mx.array([[(i * 7919) % 1000 + 10 for i in range(300)]])
    for grow in (False, True):
        for L in (1, 9):
            cache = make_prompt_cache(model)
            mx.eval(model(prompt, cache=cache))
            toks = mx.array([[11 + i for i in range(L)]])
            b, w = [], []
            for i in range(45):
                t0 = time.perf_counter()
                out = mx.argmax(model(toks, cache=cache), axis=-1)
                mx.async_eval(out)
                t1 = time.perf_counter()
                out.tolist()
                t2 = time.perf_counter()
                for c in cache:
                    c.trim(L - 4 if grow and L > 4 else (0 if grow else L))
                if i >= 5:
                    b.append((t1 - t0) * 1e3)
                    w.append((t2 - t1) * 1e3)
            print(f"mlx-lm L={L} {'growing' if grow else 'constant'} KV: build {med(b):.2f} ms, wait {med(w):.2f} ms",
                  flush=True)

    # 2. per-op host cost
    dt = mx.bfloat16 if deq else mx.float32


    def op_cost(name, fn, *args):
        mx.eval(*args)
        ts = []
        for i in range(220):
            t0 = time.perf_counter()
            y = fn(*args)
            mx.async_eval(y)
            ts.append(time.perf_counter() - t0)
            y.tolist() if y.size < 8 else mx.eval(y)
        print(f"op {name}: {1e6 * med(ts[20:]):.1f} us host per call", flush=True)


    w = mx.random.normal((1536, 576)).astype(dt)
    for M in (1, 9):
        op_cost(f"matmul M={M}", lambda x: x @ w.T, mx.random.normal((1, M, 576)).astype(dt))
    qw, qs, qb = mx.quantize(mx.random.normal((1536, 576)), group_size=32, bits=4)
    for M in (1, 9):
        op_cost(f"quantized_matmul M={M}", lambda x: mx.quantized_matmul(x, qw, qs, qb, transpose=True, group_size=32,
                                                                         bits=4), mx.random.normal((1, M, 576)).astype(dt))
    for L in (1, 9):
        for T in (333, 337):
            k = mx.random.normal((1, 3, T, 64)).astype(dt)
            op_cost(f"sdpa L={L} T={T}", lambda q: mx.fast.scaled_dot_product_attention(
                q, k, k, scale=0.125, mask="causal" if L > 1 else None), mx.random.normal((1, 9, L, 64)).astype(dt))
    op_cost("add", lambda x: x + 1, mx.random.normal((1, 9, 576)).astype(dt))
    del model


# 3. graphc: plain, speculative with the verify attention kernel, and without it (same Engine)
eng = Engine.load(src, max_batch=1, spec_adaptive=False, compile=False)
dequant(eng.model)
spec_mod = sys.modules["graphc.runtime.speculative.speculator"]
enc = {"t": 0.0}
real_async = mx.async_eval


class _MX:  # the speculator's `mx`, with async_eval timed (the encode part of a verify's build)
    def __getattr__(self, k):
        return getattr(mx, k)

    @staticmethod
    def async_eval(*a):
        t0 = time.perf_counter()
        real_async(*a)
        enc["t"] += time.perf_counter() - t0


spec_mod.mx = _MX()
views = eng.speculator.views
blocks = views.blocks
print(f"graphc verify attention kernel: {views.note}", flush=True)
prompts = grounded_prompts(eng.tokenizer, 1, seed=0, vocab=eng.vocab_size)
sp = SamplingParams(max_tokens=96, speculative="prompt_lookup", num_draft_tokens=8)
# SPEC_MODES: which speculative variants run besides plain (kernel, mlx: without the kernel;
# pause4 / nopause: a row that found no draft 4 times pauses drafting for 4 tokens / never;
# nocool: no pause after low acceptance). Each is (params, kernel blocks, speculator settings).
spec = eng.speculator
base = {"MISS_PAUSE": spec.MISS_PAUSE, "MAX_MISSES": spec.MAX_MISSES, "cooldown": spec.cooldown}
variants = {"kernel": (blocks, {}), "mlx": ({}, {}), "pause4": (blocks, {"MISS_PAUSE": 4}),
            "nopause": (blocks, {"MAX_MISSES": 10**9}), "nocool": (blocks, {"cooldown": 0, "MAX_MISSES": 10**9})}
modes = {"plain": (SamplingParams(max_tokens=96, speculative="off"), blocks, {})}
for name in os.environ.get("SPEC_MODES", "kernel,mlx").split(","):
    modes["spec_" + name] = (sp,) + variants[name]
tps = {m: [] for m in modes}
toks: dict = {}  # each mode's last output, compared with plain's
acc = {m: dict.fromkeys(("draft", "build", "wait", "post", "encode", "n", "tok"), 0.0) for m in modes}
for r in range(reps + 1):
    for m, (p, b, settings) in modes.items():
        views.blocks = b
        for k, v in {**base, **settings}.items():
            setattr(spec, k, v)
        e_tok = eng.stats["spec_emitted_tokens"]
        t_before, n0, e0 = dict(eng.speculator.timing), eng.stats["spec_steps"], enc["t"]
        t0 = time.perf_counter()
        out = eng.generate(prompts, p)
        d = time.perf_counter() - t0
        toks[m] = [o.token_ids for o in out]
        if r:
            tps[m].append(sum(len(o.token_ids) for o in out) / d)
            for k in t_before:
                acc[m][k] += eng.speculator.timing[k] - t_before[k]
            acc[m]["encode"] += enc["t"] - e0
            acc[m]["n"] += eng.stats["spec_steps"] - n0
            acc[m]["tok"] += eng.stats["spec_emitted_tokens"] - e_tok
plain = med(tps["plain"])
for m, v in tps.items():
    n, tok = acc[m].pop("n"), acc[m].pop("tok")
    per = {k: 1e3 * x / n for k, x in acc[m].items()} if n else {}
    if per:
        per["graph"] = per["build"] - per["encode"]
    same = "same tokens as plain" if toks[m] == toks["plain"] else "TOKENS DIFFER from plain"
    print(f"graphc {m}: {same}; {min(v):.1f} / {med(v):.1f} / {max(v):.1f} tok/s, x{med(v) / plain:.2f} plain; "
          f"{int(n)} verifies giving {int(tok)} of {96 * reps} tokens; ms/verify " + ", ".join(f"{k} {x:.2f}" for k, x in per.items()), flush=True)
