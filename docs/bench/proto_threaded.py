"""Prototype (run 10, measured slower, not adopted): build step N+1 on the main thread while a worker
thread encodes step N (async_eval releases the GIL). Usage: proto_threaded.py SHAPE|DIR B [STEPS]"""
import sys, time, random
from concurrent.futures import ThreadPoolExecutor
import mlx.core as mx, mlx_lm
from mlx_lm.models.cache import make_prompt_cache
now = time.perf_counter
def load(name):
    if name.startswith("/"):
        m, _ = mlx_lm.load(name); return m
    from graphc.benchmarks.shapes import load_shape
    return load_shape(name)[0]
model = load(sys.argv[1]); B = int(sys.argv[2]); N = int(sys.argv[3]) if len(sys.argv) > 3 else 64
V = model.args.vocab_size
rng = random.Random(0)
def prefill():
    cache = make_prompt_cache(model)
    x = mx.array([[rng.randrange(3, V) for _ in range(128)] for _ in range(B)])
    y = mx.argmax(model(x, cache=cache)[:, -1, :], axis=-1); mx.eval(y)
    return cache, y
def step(cache, y):
    t = mx.argmax(model(y[:, None], cache=cache)[:, -1, :], axis=-1)
    return t, mx.stop_gradient(t)
def plain():
    cache, y = prefill()
    nxt, h = step(cache, y); mx.async_eval(nxt, h); toks = []
    t0 = now()
    for _ in range(N):
        cur, ch = nxt, h
        nxt, h = step(cache, cur); mx.async_eval(nxt, h)
        toks.append(ch.tolist())
    mx.eval(nxt)
    return (now() - t0) / N * 1e3, toks
def threaded():
    S = mx.new_thread_unsafe_stream(mx.default_device())
    ex = ThreadPoolExecutor(1)
    with mx.stream(S):
        cache, y = prefill()
        nxt, h = step(cache, y); fut = ex.submit(mx.async_eval, nxt, h); toks = []
        t0 = now()
        for _ in range(N):
            cur, ch, cf = nxt, h, fut
            nxt, h = step(cache, cur)        # built while the worker encodes cur
            cf.result()
            fut = ex.submit(mx.async_eval, nxt, h)
            toks.append(ch.tolist())
        fut.result(); mx.eval(nxt)
    return (now() - t0) / N * 1e3, toks
for r in range(3):
    a, ta = plain(); rng.seed(r + 1); 
    rng.seed(r); a, ta = plain(); rng.seed(r); b, tb = threaded()
    print(f"B={B} plain {a:.2f} ms/step  threaded {b:.2f} ms/step  same tokens: {ta == tb}", flush=True)
