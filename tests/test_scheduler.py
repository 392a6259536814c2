"""Scheduler: a mixed workload under a KV budget and a small prefix pool runs to completion with
every slot returned, outputs equal to each request run alone; preemption recomputes exactly;
a long prompt never stalls running decodes; aborts at every stage."""

from __future__ import annotations

import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.grammar import Grammar
from graphc.runtime.request import Status
from helpers import random_prompts


def mixed_params(n):
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(SamplingParams(max_tokens=24, ignore_eos=True))
        elif kind == 1:
            out.append(SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, top_k=40, seed=i, ignore_eos=True))
        elif kind == 2:
            out.append(SamplingParams(max_tokens=18, temperature=0.6, seed=100 + i, repetition_penalty=1.2,
                                      frequency_penalty=0.3, ignore_eos=True))
        else:
            out.append(SamplingParams(max_tokens=60, grammar=Grammar.regex("[a-z]{2,7}( [a-z]{2,5}){2}")))
    return out


@pytest.fixture(scope="module")
def mdir(model_dir):
    return model_dir("llama")


def test_mixed_workload_with_aborts_and_too_small_budget(mdir):
    prompts = random_prompts(12, 1024, [5, 40, 17, 3, 33, 9, 60, 2, 25, 12, 48, 7], seed=13)
    params = mixed_params(12)
    alone = [Engine.load(mdir).generate([p], [sp])[0].token_ids for p, sp in zip(prompts, params)]

    eng = Engine.load(mdir, prefill_chunk=16, kv_budget_tokens=110, max_total_tokens=256)
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    victims = {ids[10]: "waiting", ids[6]: "prefilling", ids[1]: "running"}
    aborted, outs, steps = set(), {i: [] for i in ids}, 0
    while eng.has_unfinished():
        for o in eng.step():
            outs[o.request_id] += o.new_token_ids
        steps += 1
        for rid, stage in victims.items():
            req = eng.scheduler.by_id.get(rid)
            if rid in aborted or req is None:
                continue
            if (stage == "waiting" and steps == 1 and req.status is Status.WAITING
                    or stage == "prefilling" and req.status is Status.PREFILLING and 0 < req.prefilled
                    or stage == "running" and req.status is Status.RUNNING and len(req.output_ids) >= 3):
                assert eng.abort(rid)
                aborted.add(rid)
        assert steps < 2000
    assert aborted == set(victims), "every abort stage was reached"
    assert eng.stats["preemptions"] > 0, "the budget was small enough to force preemption"
    for rid, want in zip(ids, alone):
        if rid in aborted:
            assert want[: len(outs[rid])] == outs[rid]  # what it produced before the abort was right
        else:
            assert outs[rid] == want
    stats = eng.cache_stats()
    assert stats["held_requests"] == 0 and eng.runner.rows == [] and eng.runner.caches is None
    assert stats["pool_used"] == stats["tree_tokens"]  # no slot outside the tree: nothing leaked


def test_preempted_request_finishes_with_the_same_tokens(mdir):
    prompts = random_prompts(3, 1024, [30, 30, 30], seed=2)
    ps = [SamplingParams(max_tokens=40, ignore_eos=True),
          SamplingParams(max_tokens=40, temperature=1.0, seed=7, ignore_eos=True),
          SamplingParams(max_tokens=40, temperature=1.0, top_k=30, ignore_eos=True)]  # no seed: its noise seed
    ref = Engine.load(mdir, prefix_cache=False, seed=9).generate(prompts, ps)
    for cache in (True, False):
        eng = Engine.load(mdir, kv_budget_tokens=130, prefix_cache=cache, seed=9)
        got = eng.generate(prompts, ps)
        assert eng.stats["preemptions"] > 0
        assert [r.token_ids for r in got] == [r.token_ids for r in ref]


def test_prompt_larger_than_the_budget_is_refused(mdir):
    eng = Engine.load(mdir, kv_budget_tokens=64)
    with pytest.raises(ValueError, match="does not fit the KV budget of 64"):
        eng.add_request(list(range(3, 60)), SamplingParams())
    assert not eng.has_unfinished()


def test_long_prompt_never_stalls_running_decodes(mdir):
    eng = Engine.load(mdir, prefill_chunk=16)
    short = [eng.add_request([5 + i, 6, 7], SamplingParams(max_tokens=40, ignore_eos=True)) for i in range(4)]
    while any(eng.scheduler.by_id[r].status is not Status.RUNNING for r in short):
        eng.step()
    long_id = eng.add_request(random_prompts(1, 1024, [150], seed=1)[0], SamplingParams(max_tokens=4))
    prefill_steps = 0
    while eng.scheduler.by_id[long_id].status is not Status.RUNNING:
        outs = {o.request_id: o for o in eng.step()}
        prefill_steps += 1
        assert all(len(outs[r].new_token_ids) == 1 for r in short), "every running row got its token this step"
    assert prefill_steps >= 150 // 16


def test_batched_prefill_equals_one_at_a_time_and_feeds_the_prefix_cache(mdir):
    prompts = random_prompts(8, 1024, [5, 40, 17, 1, 33, 9, 64, 2], seed=11)
    ps = [SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.7 * (i % 2), seed=i, logprobs=2)
          for i in range(8)]
    batched = Engine.load(mdir, prefill_chunk=256)
    groups = []
    orig = batched.runner.prefill_batches
    batched.runner.prefill_batches = lambda gs: (groups.extend(map(len, gs)), orig(gs))[1]
    got = batched.generate(prompts, ps)
    # All eight whole prompts went through batched forwards, split where padding would be over
    # half the work (lengths 5, 40, 17, 1, 33, 9, 64, 2 in arrival order).
    assert sum(groups) == 8 and max(groups) > 1
    ref = Engine.load(mdir, prefill_chunk=256, batch_prefill=False).generate(prompts, ps)
    assert [r.token_ids for r in got] == [r.token_ids for r in ref]
    for a, b in zip(got, ref):
        assert [x["logprob"] for x in a.logprobs] == pytest.approx([x["logprob"] for x in b.logprobs], abs=1e-4)
    # Their prompts went into the prefix pool: the same prompts again hit it.
    again = batched.generate(prompts, ps)
    assert sum(r.cached_tokens for r in again) > 0
    assert [r.token_ids for r in again] == [r.token_ids for r in ref]


def test_the_scheduler_groups_whole_prompts_into_batched_prefills():
    """Prefill grouping is the scheduler's decision (plain Python): whole uncached prompts share a
    forward while the padding stays small, shortest first whatever their arrival order (the 11
    tokens of the fourth go with the 10 and 12 of the first two, across the prompt-logprobs
    request between them, which runs alone)."""
    from graphc.runtime.request import Request
    from graphc.runtime.scheduler import Scheduler

    s = Scheduler(prefill_chunk=64, batch_prefill=True)
    reqs = [Request([1] * 10, SamplingParams()), Request([2] * 12, SamplingParams()),
            Request([3] * 9, SamplingParams(prompt_logprobs=1)), Request([4] * 11, SamplingParams()),
            Request([5] * 40, SamplingParams())]
    for r in reqs:
        s.add(r)
    sched = s.schedule()
    # 40 tokens next to 10, 11 and 12 would pad 4 x 40 = 160 > the 64-token chunk and > 1.5 x 73: alone.
    assert [[r.prompt_ids[0] for r, _ in g] for g in sched.groups] == [[3], [1, 4, 2], [5]]
    off = Scheduler(prefill_chunk=64, batch_prefill=False)
    for r in [Request([1] * 10, SamplingParams()), Request([2] * 12, SamplingParams())]:
        off.add(r)
    assert [len(g) for g in off.schedule().groups] == [1, 1]


def test_the_scheduler_admits_against_the_prefix_cache_once_and_records_the_hit():
    """Prefix admission is the scheduler's (plain Python, no engine callbacks): it matches a waiting
    request once, records the hit in prefilled / cached_tokens, and counts it in one Schedule only,
    however many steps the request then waits."""
    from graphc.runtime.prefix_cache import PrefixCache
    from graphc.runtime.request import Request
    from graphc.runtime.scheduler import Scheduler

    prefix = PrefixCache(capacity=64)
    first = Request(list(range(3, 23)), SamplingParams())
    prefix.admit(first)
    prefix.insert_prompt(first)  # its 20 prompt tokens are in the tree now (slot bookkeeping only)
    prefix.release(first)
    s = Scheduler(prefill_chunk=8, prefix=prefix)
    req = Request(list(range(3, 18)) + [900, 901], SamplingParams())
    s.add(req)
    sched = s.schedule()
    assert sched.cached_tokens == 15 and req.prefilled == req.cached_tokens == 15
    assert sched.prefill == [(req, 2)] and req.status is Status.WAITING  # nothing ran yet
    assert s.schedule().cached_tokens == 0 and req.cached_tokens == 15  # not matched twice
    s.advance(req, 17)
    assert req.prefilled == 17 and req.status is Status.PREFILLING
    s.finish(req, "abort")
    assert not prefix.holds and req.finish_time is not None
    prefix.check()


def test_prompt_tokens_per_step_are_capped_while_rows_decode():
    """Scheduler(step_tokens=): an idle engine prefills up to prefill_chunk a step; once rows are
    decoding, a step spends at most step_tokens of prompt, so a long prompt stalls the running
    streams for one bounded step at a time (plain Python, no engine)."""
    from graphc.runtime.request import Request
    from graphc.runtime.scheduler import Scheduler

    s = Scheduler(prefill_chunk=512, step_tokens=64)
    first = Request([1] * 100, SamplingParams())
    s.add(first)
    assert s.schedule().prefill == [(first, 100)]  # idle: a whole chunk's worth
    s.advance(first, 100)
    s.started(first)
    long = Request([2] * 300, SamplingParams())
    s.add(long)
    spent = []
    while long.prefilled < 300:
        sched = s.schedule()
        assert sched.decode
        spent.append(sum(n for _, n in sched.prefill))
        s.advance(long, long.prefilled + spent[-1])
    assert spent == [64, 64, 64, 64, 44]
    with pytest.raises(ValueError, match="step_tokens"):
        Scheduler(step_tokens=0)


def test_a_burst_is_one_step_and_never_overruns():
    """Requests reaching an idle engine form a burst: its step admits up to BURST_TOKENS of prompt
    (here two whole prompts of 700 tokens, batched, and the first 640 of a third: a piece of a
    prompt ends on CHUNK_ALIGN); the next step decodes the burst's rows and spends at most
    step_tokens, however much still waits."""
    from graphc.runtime.request import Request
    from graphc.runtime.scheduler import Scheduler

    s = Scheduler(prefill_chunk=2048, step_tokens=128, batch_prefill=True)
    reqs = [Request([i + 1] * 700, SamplingParams()) for i in range(5)]
    for r in reqs:
        s.add(r)
    sched = s.schedule()
    assert [n for _, n in sched.prefill] == [700, 700, 640] and s.BURST_TOKENS == 2048
    assert [len(g) for g in sched.groups] == [1, 2]  # the piece alone first, then the whole two batched
    for r, n in sched.prefill:
        s.advance(r, r.prefilled + n)
        if r.prefilled == len(r.context_ids):
            s.started(r)
    nxt = s.schedule()
    # the third prompt's last 60 tokens; the fourth cannot reach an aligned end with the 68 left
    assert nxt.decode and [(r, n) for r, n in nxt.prefill] == [(reqs[2], 60)]


def _burst_steps(s, arrivals: dict | None = None) -> list:
    """Schedule steps until one decodes (running each step's chunks); arrivals: step index ->
    requests added after that step (they reach the engine while it runs)."""
    steps = []
    while True:
        sched = s.schedule()
        steps.append(sched)
        assert sum(n for _, n in sched.prefill) <= 8192
        for r, n in sched.prefill:
            s.advance(r, r.prefilled + n)
            if r.prefilled == len(r.context_ids):
                s.started(r)
        if sched.decode:
            return steps
        for r in (arrivals or {}).get(len(steps) - 1, []):
            s.add(r)


def test_requests_that_arrive_during_a_burst_join_it():
    """Requests sent together reach the engine over a while: those that arrive while a burst step
    runs are admitted by the burst's next step, before anything decodes, even when the step
    before took every prompt that was waiting; the burst ends at a step with nothing to admit."""
    from graphc.runtime.request import Request
    from graphc.runtime.scheduler import Scheduler

    s = Scheduler(max_batch=64, prefill_chunk=2048, step_tokens=1024, batch_prefill=True, burst=(65536, 8192))
    first = [Request([i + 1] * n, SamplingParams()) for i, n in enumerate([300, 700])]
    later = [Request([i + 9] * n, SamplingParams()) for i, n in enumerate([900, 120, 1800])]
    for r in first:
        s.add(r)
    steps = _burst_steps(s, {0: later[:2], 1: later[2:]})
    assert [st.decode for st in steps] == [False, False, False, True]
    assert [sorted(len(r.context_ids) for r, _ in st.prefill) for st in steps] == [[300, 700], [120, 900], [1800], []]
    assert len(s.running) == 5 and not s.waiting
    cpu = Scheduler(max_batch=64, prefill_chunk=2048, step_tokens=1024, batch_prefill=True)
    cpu.add(Request([1] * 300, SamplingParams()))
    assert cpu.schedule().decode  # the CPU's burst is one step of 2,048 tokens: it decodes at once


def test_a_device_burst_admits_every_prompt_that_fits_before_decoding():
    """With a device's larger burst (runtime/scheduler.py BURST_SIZES: CUDA's), prompts that reach an
    idle engine are all admitted before anything decodes, BURST_STEP_TOKENS a step: a long prompt's
    first chunk does not end a burst step (the prompts behind it are admitted in the same step and
    it goes first in the next), whole prompts are batched shortest first, and decoding starts when
    the burst is in. The CPU's burst (the class's sizes) stays one step."""
    from graphc.runtime.request import Request
    from graphc.runtime.scheduler import Scheduler, burst_sizes

    assert burst_sizes("cpu") == (Scheduler.BURST_TOKENS, Scheduler.BURST_STEP_TOKENS) == (2048, 2048)
    assert burst_sizes("cuda") == (65536, 8192)
    s = Scheduler(max_batch=64, prefill_chunk=2048, step_tokens=1024, batch_prefill=True, burst=(65536, 8192))
    lengths = [5000, 300, 900, 2100, 120, 700, 3000, 64, 1500, 800]
    reqs = [Request([i + 1] * n, SamplingParams()) for i, n in enumerate(lengths)]
    for r in reqs:
        s.add(r)
    steps = _burst_steps(s)
    assert not s.waiting and len(s.running) == len(reqs)  # every prompt in before the first decode
    assert [st.decode for st in steps] == [False] * (len(steps) - 1) + [True]
    assert not steps[-1].prefill  # the burst ends at the step that finds nothing more to admit
    first = steps[0]
    # the 5,000-token prompt's first 2,048 tokens did not end the step: the prompts behind it came in too
    assert first.prefill[0] == (reqs[0], 2048) and len(first.prefill) > 2
    whole = [g for g in first.groups if len(g) > 1]
    assert whole and all([n for _, n in g] == sorted(n for _, n in g) for g in whole)
    assert len(steps) < 5  # 14,484 prompt tokens: two steps of 8,192 and the long prompts' last chunks
    cpu = Scheduler(max_batch=64, prefill_chunk=2048, step_tokens=1024, batch_prefill=True)
    for r in [Request([i + 1] * n, SamplingParams()) for i, n in enumerate(lengths)]:
        cpu.add(r)
    assert cpu.schedule().decode and len(cpu.waiting) > 5  # one step, then every step decodes


def test_a_long_burst_is_exact_and_joins_the_batch_once(mdir):
    """CUDA's longer burst (forced here on the CPU): prompts of several lengths, some longer than a
    prefill chunk, admitted over several steps before anything decodes, give mlx-lm's own greedy
    tokens, and the burst's rows join the decode batch in one extend per layer at its last step."""
    from graphc.runtime.cache.full import FullKV
    from helpers import assert_greedy_matches_mlx_lm

    prompts = random_prompts(9, 1024, [70, 5, 33, 140, 12, 64, 90, 3, 41], seed=4)
    eng = Engine.load(mdir, prefill_chunk=48)
    eng.scheduler.BURST_TOKENS, eng.scheduler.BURST_STEP_TOKENS = 4096, 160
    joins, burst_steps = [], []
    orig_join, orig_sched = eng.runner._join_rows, eng.scheduler.schedule
    eng.runner._join_rows = lambda reqs, parts: (joins.append(len(reqs)), orig_join(reqs, parts))[1]
    eng.scheduler.schedule = lambda: (lambda s: (burst_steps.append(not s.decode), s)[1])(orig_sched())
    extends = []
    orig_extend = FullKV.extend_all
    FullKV.extend_all = lambda self, others, keep=None: (extends.append(len(others)), orig_extend(self, others, keep))[1]
    try:
        got = eng.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    finally:
        FullKV.extend_all = orig_extend
    assert sum(burst_steps) >= 2  # 458 prompt tokens at 160 a step: steps that admitted without decoding
    assert burst_steps[:sum(burst_steps)] == [True] * sum(burst_steps)
    assert joins == [9]  # every row joined at once, when the burst was in
    assert len(extends) == len(eng.runner.policies) and all(n > 1 for n in extends)  # one extend_all per layer, several parts
    assert_greedy_matches_mlx_lm(eng.model, prompts, got, 6)


def test_pieces_of_prompts_end_on_the_alignment():
    """Every chunk that does not end its prompt ends on a multiple of CHUNK_ALIGN, whatever the
    budget left by the prompts before it or where a prefix hit started it, so chunk forwards
    repeat a few attention shapes (on CUDA each new one builds a cuDNN plan); every prompt still
    gets all its tokens, in order."""
    from graphc.runtime.request import Request
    from graphc.runtime.scheduler import Scheduler

    s = Scheduler(prefill_chunk=2048, step_tokens=256)
    s.running = [Request([1], SamplingParams())]  # rows decode: steps of step_tokens
    reqs = [Request([i + 2] * n, SamplingParams()) for i, n in enumerate((90, 1000, 37, 700))]
    reqs[1].prefilled = reqs[1].cached_tokens = 0
    reqs[3].prefilled = reqs[3].cached_tokens = 45  # as after a prefix hit
    for r in reqs:
        s.add(r)
    seen = {r.id: [] for r in reqs}
    for _ in range(40):
        sched = s.schedule()
        if not sched.prefill:
            break
        assert sum(n for _, n in sched.prefill) <= 256
        for r, n in sched.prefill:
            end = r.prefilled + n
            assert end == len(r.context_ids) or end % s.CHUNK_ALIGN == 0, (r.prefilled, n)
            seen[r.id].append((r.prefilled, end))
            s.advance(r, end)
            if end == len(r.context_ids):
                s.waiting.remove(r)
    for r in reqs:
        pieces = seen[r.id]
        assert pieces[0][0] == r.cached_tokens and pieces[-1][1] == len(r.context_ids)
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))


def test_a_budget_below_the_alignment_still_makes_progress():
    """A prefill chunk or step budget below CHUNK_ALIGN turns alignment off (no step could reach
    an aligned end)."""
    from graphc.runtime.request import Request
    from graphc.runtime.scheduler import Scheduler

    s = Scheduler(prefill_chunk=64, step_tokens=16)
    s.running = [Request([1], SamplingParams())]
    r = Request([3] * 100, SamplingParams())
    s.add(r)
    sched = s.schedule()
    assert [n for _, n in sched.prefill] == [16]


def test_step_tokens_bound_the_stall_and_keep_greedy_tokens(mdir):
    """A 150-token prompt that arrives while 4 rows decode is spread over steps of step_tokens;
    every running row gets its token every step, and every request's greedy tokens are those it
    gets alone."""
    prompts = [[5 + i, 6, 7] for i in range(4)]
    long_prompt = random_prompts(1, 1024, [150], seed=1)[0]
    p = SamplingParams(max_tokens=30, ignore_eos=True)
    alone = [Engine.load(mdir).generate([x], [p])[0].token_ids for x in prompts + [long_prompt]]
    eng = Engine.load(mdir, step_tokens=16)
    short = [eng.add_request(x, p) for x in prompts]
    outs = {r: [] for r in short}
    while any(eng.scheduler.by_id[r].status is not Status.RUNNING for r in short):
        for o in eng.step():
            outs[o.request_id] += o.new_token_ids
    long_id = eng.add_request(long_prompt, p)
    outs[long_id] = []
    steps = 0
    while eng.scheduler.by_id[long_id].status is not Status.RUNNING:
        got = {o.request_id: o for o in eng.step()}
        steps += 1
        for o in got.values():
            outs[o.request_id] += o.new_token_ids
        assert all(len(got[r].new_token_ids) == 1 for r in short), "every running row got its token this step"
    assert steps >= 150 // 16
    while eng.has_unfinished():
        for o in eng.step():
            outs[o.request_id] += o.new_token_ids
    assert [outs[r] for r in short + [long_id]] == alone

