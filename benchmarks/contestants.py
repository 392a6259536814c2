"""The three contestants, each timed the same way.

- graphc: the Engine (scheduler, chained decode, graph lowering, optional mx.compile)
- batchgen: mlx-lm's BatchGenerator (what `mlx_lm.batch_generate` drives)
- plain: the floor of what MLX itself does — the mlx-lm model called on a batched
  `make_prompt_cache` KV cache in a two-deep pipelined loop (generate_step's loop
  without its logsumexp), argmax on the device, tokens read back each step.

Steady-state decode is timed in windows of `steps` decode steps after every row is
decoding and `warmup` steps have run (kernel JIT, cache growth); each window gives
ms/step; the caller takes the median. Prefill is never inside a window.
"""

from __future__ import annotations

import gc
import time
from statistics import mean, median

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import load as load_tokenizer

from graphc.benchmarks.kernel_tune import rotating_weights, time_matmul
from graphc.compiler.lower import StepInputs
from graphc.compiler.modelgen import demo_model_path
from graphc.runtime import Engine, EngineConfig, SamplingParams
from graphc.runtime.decode_input import next_input
from graphc.runtime.kernels import skinny_matmul
from graphc.runtime.kernels import skinny_matmul as sk
from graphc.runtime.request import Status

now = time.perf_counter


def free() -> None:
    gc.collect()
    mx.clear_cache()


class nogc:
    """No Python garbage collection inside a timed window (the same for every contestant)."""

    def __enter__(self):
        gc.collect()
        gc.disable()

    def __exit__(self, *exc):
        gc.enable()


# -- graphc -------------------------------------------------------------------------
def engine_options() -> set[str]:
    return set(EngineConfig.option_names())


def make_engine(model, tokenizer, config, *, graph=None, **kw):
    """An Engine with only the options it has (NotImplementedError naming a missing one)."""
    opts = engine_options()
    missing = [k for k, v in kw.items() if k not in opts and v not in (None, False)]
    if missing:
        raise NotImplementedError(f"Engine has no option {', '.join(missing)}")
    kw = {k: v for k, v in kw.items() if k in opts}
    return Engine(model, tokenizer, config, graph, **kw)


def graphc_params(max_tokens: int, sampling: dict | None = None):
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **(sampling or {}))


def graphc_decode(model, tokenizer, config, prompts, *, warmup, steps, repeats, sampling=None,
                  graph=None, tick=None, **engine_kw) -> list[float]:
    """ms/step of each timed window, with len(prompts) rows decoding."""
    B = len(prompts)
    eng = make_engine(model, tokenizer, config, graph=graph, max_batch=max(B, 1),
                      prefill_chunk=max(512, len(prompts[0])), **engine_kw)
    params = graphc_params(warmup + steps * repeats + 2 * B + 16, sampling)
    ids = [eng.add_request(p, params) for p in prompts]
    while eng.scheduler.waiting:
        eng.step()
    for _ in range(warmup):
        eng.step()
    out = []
    for _ in range(repeats):
        with nogc():
            t0 = now()
            for _ in range(steps):
                eng.step()
            out.append((now() - t0) * 1e3 / steps)
        if tick:
            tick()
    for i in ids:
        eng.abort(i)
    del eng
    free()
    return out


def graphc_host(model, tokenizer, config, prompts, *, warmup, steps, graph=None, **engine_kw) -> dict:
    """Host time to build one lazy decode step, to submit it, and the device time after it.

    The chain is switched off for this: each step is built, submitted with async_eval
    and waited for, so build time is not hidden behind the previous step.
    """
    B = len(prompts)
    eng = make_engine(model, tokenizer, config, graph=graph, max_batch=max(B, 1),
                      prefill_chunk=max(512, len(prompts[0])), chain=False, **engine_kw)
    params = graphc_params(warmup + 2 * steps + 8)
    ids = [eng.add_request(p, params) for p in prompts]
    while eng.scheduler.waiting:
        eng.step()
    for _ in range(warmup):
        eng.step()
    runner = eng.runner
    step_fn = getattr(runner, "decode_step", None) or runner.compiled.decode
    build, submit, device = [], [], []
    for _ in range(steps):
        t0 = now()
        toks, sampling = next_input(runner.sampler, runner.rows, runner.pending)
        out = step_fn(StepInputs(toks, runner.caches, sampling=sampling))
        t1 = now()
        mx.async_eval(out.next_tokens)
        t2 = now()
        mx.eval(out.next_tokens)
        t3 = now()
        build.append(t1 - t0)
        submit.append(t2 - t1)
        device.append(t3 - t1)
    for i in ids:
        eng.abort(i)
    del eng
    free()
    return _host_summary(build, submit, device)


def _host_summary(build, submit, device) -> dict:
    return {"build_ms": median(build) * 1e3, "submit_ms": median(submit) * 1e3,
            "device_ms": median(device) * 1e3}


def graphc_exact(model, tokenizer, config, prompts, max_tokens: int) -> dict:
    """Greedy tokens of compiled against uncompiled decode on the same prompts.

    On the CPU (float32 tests) they are identical; on a GPU the fused projections and the
    ragged attention kernel round differently, so a near-tie may flip a token: this
    reports how long each row stays identical.
    """
    outs = []
    for comp in (False, True):
        eng = make_engine(model, tokenizer, config, max_batch=len(prompts), compile=comp)
        outs.append([r.token_ids for r in eng.generate(prompts, graphc_params(max_tokens))])
        del eng
        free()
    same = []
    for a, b in zip(*outs):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        same.append(n)
    return {"rows": len(prompts), "identical_rows": sum(n == max_tokens for n in same),
            "prefix_match": sum(same) / (len(prompts) * max_tokens), "first_divergence": min(same)}


def compiled_info(model, tokenizer, config) -> dict:
    eng = make_engine(model, tokenizer, config, compile=True)
    d = eng.compiled.decode
    info = {"fused_layers": len(getattr(d, "fused", {}) or {}),
            "ragged_kernel": "on" if getattr(d, "kernel", False) else f"off ({getattr(d, 'kernel_note', '?')})"}

    note = skinny_matmul.check()  # the bench measures it wherever it works, not only when asked
    info["skinny_gemm"] = "on" if note is None else f"off ({note})"
    del eng
    free()
    return info


# -- mlx-lm BatchGenerator ---------------------------------------------------------------
def batchgen_decode(model, prompts, *, warmup, steps, repeats, sampling=None, tick=None) -> list[float]:
    B = len(prompts)
    sampler = None
    if sampling:
        sampler = make_sampler(temp=sampling.get("temperature", 0.0), top_p=sampling.get("top_p", 0.0),
                               top_k=sampling.get("top_k", 0))
    gen = BatchGenerator(model, max_tokens=warmup + steps * repeats + 2 * B + 16, sampler=sampler,
                         completion_batch_size=B, prefill_batch_size=min(B, 8))
    uids = gen.insert(prompts)
    seen = set()
    while len(seen) < len(uids):
        for r in gen.next_generated():
            seen.add(r.uid)
    for _ in range(warmup):
        gen.next_generated()
    out = []
    for _ in range(repeats):
        with nogc():
            t0 = now()
            for _ in range(steps):
                rs = gen.next_generated()
            out.append((now() - t0) * 1e3 / steps)
        assert len(rs) == B, "a BatchGenerator row finished inside a timed window"
        if tick:
            tick()
    gen.remove(uids)
    gen.close()
    del gen
    free()
    return out


# -- the plain mlx-lm loop -----------------------------------------------------------------
def plain_prefill(model, prompts, chunk: int = 2048):
    """mlx-lm's own prefill of equal-length prompts in ``chunk``-token pieces: (its prompt cache,
    each row's last prompt token [B]), the starting point of `plain_step`."""
    cache = make_prompt_cache(model)
    x = mx.array(prompts, dtype=mx.int32)  # equal lengths: no padding needed
    while x.shape[1] > 1:
        n = min(chunk, x.shape[1] - 1)
        model(x[:, :n], cache=cache)
        mx.eval([c.state for c in cache])
        x = x[:, n:]
    return cache, x[:, 0]


def plain_step(model, cache, y):
    """One greedy mlx-lm decode step from the tokens ``y`` [B]: the next tokens [B], lazy."""
    return mx.argmax(model(y[:, None], cache=cache)[:, -1, :], axis=-1)


def plain_decode(model, prompts, *, warmup, steps, repeats, tick=None) -> list[float]:
    cache, y = plain_prefill(model, prompts)
    nxt = plain_step(model, cache, y)
    mx.async_eval(nxt)

    def run(n):
        nonlocal nxt
        for _ in range(n):
            cur = nxt
            nxt = plain_step(model, cache, cur)
            mx.async_eval(nxt)
            cur.tolist()

    run(warmup)
    out = []
    for _ in range(repeats):
        with nogc():
            t0 = now()
            run(steps)
            out.append((now() - t0) * 1e3 / steps)
        if tick:
            tick()
    mx.eval(nxt)
    del cache, nxt
    free()
    return out


def plain_host(model, prompts, *, warmup, steps) -> dict:
    cache, y = plain_prefill(model, prompts)
    for _ in range(warmup):
        y = plain_step(model, cache, y)
        mx.eval(y)
    build, submit, device = [], [], []
    for _ in range(steps):
        t0 = now()
        y = plain_step(model, cache, y)
        t1 = now()
        mx.async_eval(y)
        t2 = now()
        mx.eval(y)
        t3 = now()
        build.append(t1 - t0)
        submit.append(t2 - t1)
        device.append(t3 - t1)
    del cache
    free()
    return _host_summary(build, submit, device)


# -- shared-prefix time to first token ---------------------------------------------------------
def graphc_prefix(model, tokenizer, config, prompts, max_tokens, *, graph=None, **engine_kw) -> dict:
    eng = make_engine(model, tokenizer, config, graph=graph, max_batch=max(64, len(prompts)), **engine_kw)
    params = graphc_params(max_tokens)
    t0 = now()
    res = eng.generate(prompts, params)
    wall = now() - t0
    out = _prefix_summary([r.ttft_s for r in res], sum(len(r.token_ids) for r in res), wall)
    out["cached_tokens"] = sum(r.cached_tokens or 0 for r in res)
    del eng
    free()
    return out


def batchgen_first_times(gen, prompts) -> tuple[list, int, float]:
    """Insert `prompts` into a BatchGenerator and run it to the end: each prompt's time to its
    first token (NaN if it never got one), tokens generated, and the wall time from the insert."""
    t0 = now()
    uids = gen.insert(prompts)
    first, n = {}, 0
    while len(first) < len(uids):
        rs = gen.next_generated()
        if not rs:
            break
        t = now()
        for r in rs:
            first.setdefault(r.uid, t - t0)
            n += 1
    while rs := gen.next_generated():
        n += len(rs)
    return [first.get(u, float("nan")) for u in uids], n, now() - t0


def batchgen_prefix(model, prompts, max_tokens) -> dict:
    gen = BatchGenerator(model, max_tokens=max_tokens, completion_batch_size=max(32, len(prompts)))
    ttfts, n, wall = batchgen_first_times(gen, prompts)
    gen.close()
    del gen
    free()
    return _prefix_summary(ttfts, n, wall)


def _prefix_summary(ttfts, generated, wall) -> dict:
    return {"ttft_median_ms": median(ttfts) * 1e3, "ttft_mean_ms": mean(ttfts) * 1e3,
            "ttft_max_ms": max(ttfts) * 1e3, "wall_s": wall, "generated": generated,
            "tok_per_s": generated / wall}


# -- MLX's own matmul at decode shapes ------------------------------------------------------------
def matmul_rows(K: int, N: int, batches, dtype=mx.bfloat16, reps: int = 20) -> list[dict]:
    """Median time of a bare matmul at a decode shape per B rows, and its weight bandwidth.

    Two formulations of the same product: `x @ W.T` (what nn.Linear runs) and `W @ x.T`
    (the transposed problem; the library may pick another kernel for it).
    """
    Ws = rotating_weights(K, N, dtype)
    rows = []
    variants = {"x@W.T": lambda x, w: x @ w.T, "W@x.T": lambda x, w: w @ x.T}
    if sk.check() is None:  # graphc's kernel (Engine(skinny_gemm=True)), where it built and matched
        variants["skinny"] = sk.matmul
    for B in batches:
        x = mx.random.normal((B, K), dtype=dtype)
        mx.eval(x)
        for name, f in variants.items():
            t = time_matmul(f, x, Ws, reps)
            rows.append({"B": B, "K": K, "N": N, "variant": name, "us": t * 1e6, "GBps": K * N * 2 / t / 1e9})
    del Ws
    free()
    return rows


def text_tokenizer(tokenizer):
    """A real tokenizer for workloads that need text (grammars): the model's, or for in-memory
    shapes (token-id prompts only) the built-in demo model's byte-level BPE."""
    if hasattr(tokenizer, "_tokenizer"):
        return tokenizer

    return load_tokenizer(demo_model_path())


def graphc_admission(model, tokenizer, config, prompts, long_prompt, *, warmup, steps, prefill_chunk,
                     **engine_kw) -> dict:
    """len(prompts) rows decode; a long prompt is then admitted in chunks of `prefill_chunk`.

    Returns the running rows' ms/step before (steady) and while the long prompt is prefilled
    (each of those steps also runs one prefill chunk), and how many steps admission took."""
    B = len(prompts)
    eng = make_engine(model, tokenizer, config, max_batch=B + 1, prefill_chunk=prefill_chunk, **engine_kw)
    params = graphc_params(warmup + 2 * steps + len(long_prompt) // prefill_chunk + 16)
    ids = [eng.add_request(p, params) for p in prompts]
    while eng.scheduler.waiting:
        eng.step()
    for _ in range(warmup):
        eng.step()
    with nogc():
        t0 = now()
        for _ in range(steps):
            eng.step()
        steady = (now() - t0) * 1e3 / steps
        lid = eng.add_request(long_prompt, graphc_params(4))
        during = []
        while eng.scheduler.by_id[lid].status is not Status.RUNNING:
            t = now()
            eng.step()
            during.append((now() - t) * 1e3)
    for i in ids + [lid]:
        eng.abort(i)
    del eng
    free()

    return {"steady_ms": steady, "during_ms": median(during), "max_ms": max(during), "steps": len(during)}
