"""`Engine.warm_up()`: what `graphc serve` runs before it reports ready (`--warmup`, on by
default), and what an application embedding the Engine can call before taking traffic.

The first request a fresh process serves otherwise pays for everything built on first use:
MLX's kernels (JIT-compiled on CUDA, cached on disk per machine under /tmp/mlx/<version>/ptx;
on the CPU, `mx.compile`'s C++), graphc's own CUDA kernels (attention, the top-ranks and
choose kernels of sampling), and the compiled decode step's trace. On a freshly started H200,
a benchmark's model build and first two calls at Llama-3.2-1B batch 64 took more than 150 s
together (benchmarks/probes/cold_start.py splits it, with and without this warm-up). Two short requests run here instead, before `/health` says ok: one
greedy, one sampled with temperature, top-p and top-k, each at batch 1, through the engine's
defaults (so a server default of speculative decoding is warmed too). Then the shapes serving
meets next (`serving_shapes`): four prompts admitted together (one batched prefill forward, a
decode batch of 4), and while they decode a prompt of one step budget plus 32 tokens, which
prefills in two chunks (a full one without the LM head, a last one at an offset) and joins the
decoding batch (an extend of its caches, batch 5), with the copies that drop rows from a batch run
once on the 4 rows' caches (`row_copies`); rows that end early left vacant, a prompt written
into one in place, and a decode step whose growth copy drops them (`vacant_row_paths`); each
build of graphc's decode attention kernel that a batch of up to max-batch rows picks (a batch past 8 and past 16 rows switches build, each
loaded on its first launch in a process, `decode_kernel_builds`): on a GPU only, where first shapes cost
(kernel JIT, cuDNN attention graphs per shape), and every aligned prompt-chunk attention shape up
to 4096 tokens of context within 20 s (runtime/warmup_plans.py). On the CPU eager ops build nothing on first use:
there it measured no faster first traffic (8 requests at 8 req/s after a fresh start, three
seeds) for a warm-up of 5 s instead of 0.5 s. Other batch sizes' compiled traces
(`compile="auto"`) are still built when a batch of that size first decodes.

With a disk tier (`kv_cache_dir`) everything above runs against a scratch folder, and on a GPU a
conversation turn follows (`agent_turn`): a prompt of one block and a bit, forgotten by the memory
tier, then grown by a turn and read back from disk, the path of a client's first turn after a
restart. The client's folder is left as it was: a chain's tail file is replaced by the next
sequence that ends on it, so a warm-up prompt written there would push out a short conversation's.

It must run on the thread that will step the engine: MLX's CUDA backend keeps its cuDNN
attention plans, handles and command encoders per thread (`AsyncEngine.warm_up()` runs it on the
engine thread; `graphc serve` does that before it reports ready).

The warm-up's tokens are taken back out of the engine's counters (and the prefix cache's), and its
forwards do not feed the prefill-rate estimate (runtime/prefill_rate.py), so `/metrics` counts only
what clients asked for. Its prompt is a fixed draw of token ids from the whole vocabulary: a
client's prompt sharing a prefix-cache entry with it would only be a cache hit, never a wrong
answer. Under a KV budget too small for 16 + 8 tokens it is shorter, so it is never refused."""

from __future__ import annotations

import logging
import random
import tempfile
import time

import mlx.core as mx

from graphc.runtime.params import SamplingParams

from .cache.full import MIN_CAPACITY
from .cache.row_copies import warm_row_copies
from .warmup_plans import attention_plans, batched_plans

log = logging.getLogger("graphc.server")

PROMPT_TOKENS = 16
NEW_TOKENS = 8
ROWS = 4  # serving_shapes: the decode batch a chunked prompt joins


def warm_up(engine, shapes: bool | None = None, agent: bool | None = None) -> float:
    """Run the two warm-up requests on `engine`, then the serving shapes (`shapes`; None: on a GPU
    only) and, with a disk tier, a conversation turn read back from disk (`agent`; None: as
    `shapes`); seconds taken. On the thread that steps the engine, before traffic: with requests
    in the engine it refuses (its steps would run theirs, and their tokens would go nowhere)."""
    if engine.has_unfinished():
        raise RuntimeError(f"warm_up() runs before traffic: {len(engine.scheduler.by_id)} request(s) are in the "
                           "engine (warm up first, or wait until they finish)")
    tier, prefix = engine.disk_tier, engine.prefix
    counted = dict(prefix.counters) if prefix is not None else None
    # Its forwards are each the first of their shape (kernel builds): no measure of the prefill rate.
    with engine.prefill_rate.paused():
        if tier is None:
            took = _warm_up(engine, shapes, False)
        else:
            # On a scratch folder: the warm-up's prompts must not replace a client's tail files, and the
            # memory tier forgets them after, so no later eviction writes them to the client's folder.
            with tempfile.TemporaryDirectory(prefix="graphc-warmup-kv-") as root, tier.scratch(root):
                took = _warm_up(engine, shapes, agent)
    if counted is not None:  # hits and evictions by tier: client traffic only, as `stats`
        prefix.counters.update(counted)
    return took


def _warm_up(engine, shapes: bool | None, agent: bool | None) -> float:
    rng = random.Random(0x9A7C)
    vocab = max(1, int(engine.vocab_size))
    n, sched = PROMPT_TOKENS, engine.scheduler
    if sched.kv_budget is not None:  # a small --kv-budget-tokens: a shorter prompt, never a refused one
        # add_request takes prompt + HEADROOM <= budget; the HEADROOM covers the NEW_TOKENS too
        n = min(n, sched.kv_budget - sched.HEADROOM - 2)
        if n < 1:
            return 0.0
    prompt = [rng.randrange(vocab) for _ in range(n)]
    before = dict(engine.stats)
    t0 = time.perf_counter()
    for sampling in ({"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": 0}):
        try:
            engine.generate([prompt], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, **sampling))
        except Exception as e:  # an engine that cannot serve this cannot serve clients: say so at load
            raise RuntimeError(f"the warm-up request ({sampling}) failed: {type(e).__name__}: {e} "
                               "(--no-warmup starts the server without it)") from e
    gpu = mx.default_device().type == mx.DeviceType.gpu
    engine.idle_warm.clear()  # listed again below
    if shapes or (shapes is None and gpu):
        serving_shapes(engine, rng, vocab)
        vacant_row_paths(engine, rng, vocab)
        decode_kernel_builds(engine)
        attention_plans(engine)  # on a GPU: the prompt chunks' attention shapes (warmup_plans.py)
        batched_plans(engine)  # and the batched prefills' (several whole prompts in one forward)
    if engine.disk_tier is not None and (agent or (agent is None and (shapes or (shapes is None and gpu)))):
        agent_turn(engine, rng, vocab)
    for k in engine.stats:  # taken back out: /metrics counts client traffic only
        engine.stats[k] = before.get(k, 0)
    return time.perf_counter() - t0


def serving_shapes(engine, rng: random.Random, vocab: int) -> bool:
    """ROWS short prompts admitted together, then, while they decode, a prompt that prefills in two
    chunks and joins their batch (see the module docstring); False where the engine's max batch or
    KV budget cannot hold it (then those shapes are first met by clients)."""
    sched = engine.scheduler
    budget = sched.step_tokens if isinstance(sched.step_tokens, int) else sched.step_tokens_floor
    long_n = min(budget, sched.prefill_chunk) + 32
    need = ROWS * (PROMPT_TOKENS + sched.HEADROOM + NEW_TOKENS) + long_n + sched.HEADROOM + NEW_TOKENS
    if sched.max_batch < ROWS + 1 or (sched.kv_budget is not None and need > sched.kv_budget):
        return False
    p = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    try:
        for _ in range(ROWS):
            engine.add_request([rng.randrange(vocab) for _ in range(PROMPT_TOKENS)], p)
        engine.step()  # the burst: one batched prefill, first tokens
        engine.step()  # a decode step of ROWS rows
        row_copies(engine)
        engine.add_request([rng.randrange(vocab) for _ in range(long_n)], p)
        while engine.has_unfinished():
            engine.step()
    except Exception as e:  # as for the two requests above: say so at load
        raise RuntimeError(f"the warm-up's serving shapes failed: {type(e).__name__}: {e} "
                           "(--no-warmup starts the server without it)") from e
    return True


def vacant_row_paths(engine, rng: random.Random, vocab: int) -> bool:
    """The batch-row paths a server meets in its first minutes and serving_shapes does not: rows
    whose requests end early stay vacant, a prompt that arrives then is written into one of them in
    place (FullKV.fill_rows), and the decode step that crosses the batch's first capacity boundary
    grows the buffers in the copy that drops the vacant rows past the spare ones
    (runtime/batch_rows.py). Why: the first prompt written into a vacant row cost a client step
    seconds on a fresh GPU (docs/scheduling.md). ROWS short prompts, two of them ending after two
    tokens, a fifth joining then, the rest decoding past MIN_CAPACITY columns. False where the engine's max batch
    or KV budget cannot hold it."""
    sched = engine.scheduler
    long_tokens = MIN_CAPACITY + NEW_TOKENS  # past the first capacity boundary of a short row
    need = ROWS * (PROMPT_TOKENS + sched.HEADROOM + long_tokens)
    if sched.max_batch < ROWS or (sched.kv_budget is not None and need > sched.kv_budget):
        return False
    short = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    long = SamplingParams(max_tokens=long_tokens, temperature=0.0, ignore_eos=True)
    prompt = lambda: [rng.randrange(vocab) for _ in range(PROMPT_TOKENS)]
    try:
        ends = [engine.add_request(prompt(), p) for p in (short, short, long, long)]
        while any(engine.request(i) is not None for i in ends[:2]):  # (None once finished)
            engine.step()
        engine.add_request(prompt(), short)  # joins into a vacant row, then leaves it vacant again
        while engine.has_unfinished():
            engine.step()
    except Exception as e:  # as for the requests above: say so at load
        raise RuntimeError(f"the warm-up's vacant-row paths failed: {type(e).__name__}: {e} "
                           "(--no-warmup starts the server without it)") from e
    return True


def row_copies(engine) -> int:
    """On the decode batch's layer caches (the ROWS rows of serving_shapes), the copies that drop
    rows from a batch (runtime/cache/row_copies.py `warm_row_copies`: a run copied, scattered rows
    gathered as 8-byte words): the first drop of scattered rows, vacant or ended, is a client's
    step otherwise. How many planes."""
    caches = engine.runner.caches or []
    parts = [p for c in caches for p in (getattr(c, "caches", None) or [c])]  # a ListCache's parts
    return sum(warm_row_copies(p) for p in parts)


def decode_kernel_builds(engine) -> int:
    """Where eager decode steps over left-padded rows take graphc's attention kernel: each of its
    builds (kernel and template arguments) a batch of 1..max_batch rows picks, launched once, so no
    client's step is the first of its build in this process (runtime/kernels/decode_attention.py
    `DecodeAttention.warm`); how many."""
    views = engine.runner.views
    if views is None or not views.on:
        return 0
    n = views.warm(engine.scheduler.max_batch)
    log.info("warm-up: %d decode attention kernel builds", n)
    return n


def agent_turn(engine, rng: random.Random, vocab: int) -> bool:
    """With a disk tier (the warm-up's scratch one): a prompt of one block and a bit, forgotten by
    the memory tier, then the same prompt grown by a turn, whose blocks and tail are read back
    from disk into the pool: the first turn of a conversation after a restart builds nothing.
    False where the KV budget cannot hold it."""
    sched, tier = engine.scheduler, engine.disk_tier
    n = tier.block + 32
    if sched.kv_budget is not None and n + 16 + sched.HEADROOM + NEW_TOKENS > sched.kv_budget:
        return False
    p = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    first = [rng.randrange(vocab) for _ in range(n)]
    try:
        engine.generate([first], p)
        tier.flush()
        engine.prefix.flush()  # as after a restart: only the disk holds it
        engine.generate([first + [rng.randrange(vocab) for _ in range(16)]], p)
    except Exception as e:  # as for the requests above: say so at load
        raise RuntimeError(f"the warm-up's disk-tier turn failed: {type(e).__name__}: {e} "
                           "(--no-warmup starts the server without it)") from e
    return True
