"""A final prompt chunk riding a decode launch (runtime/mixed_step.py) is read with that launch's
tokens: with the chain on, in the next step, after the launch after it is queued. Between launch
and read the prompt is computed and its first token unknown; these tests pin what must hold then
(the scheduler leaves it alone, an abort, every row leaving, a fault, a first token that ends it)
and that the tokens stay the separate steps' (the suite's reference BLAS makes that exact)."""

from __future__ import annotations

import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime import host_read
from graphc.runtime.grammar import Grammar

from helpers import reference_greedy

MIXED = {"mixed_step": True}
ROW = [11 + i for i in range(20)]  # the row decoding while the prompt arrives
PROMPT = [300 + i for i in range(45)]  # two chunks (a whole prompt would go to the batched prefill)
LONG = SamplingParams(max_tokens=14, ignore_eos=True)


def _engine(path, mixed=True, **kw):
    return Engine.load(path, decode_options=MIXED if mixed else {}, max_batch=4, step_tokens=32, prefill_chunk=32,
                       **kw)


class Trace:
    """The engine step of each request's first token; every request that joined the decode batch;
    every riding chunk launched (step, request, final) and read (step, request, whether the
    launch after its own was queued by then)."""

    def __init__(self, eng):
        self.eng, self.step, self.joined, self.launched, self.read, self.first = eng, 0, [], [], [], {}
        run, mixed, batch = eng.runner, eng.runner.mixed, eng.runner.batch
        forward, read, join = (mixed.forward, mixed.read, batch.join) if mixed is not None else (None, None, batch.join)

        def spy_join(reqs, parts):
            self.joined += [r.id for r in reqs]
            return join(reqs, parts)

        batch.join = spy_join
        if mixed is None:
            return

        def spy_forward(step, inputs):
            ctx, rider = forward(step, inputs)
            self.launched.append((self.step, rider.prep.req.id, rider.prep.final))
            return ctx, rider

        def spy_read(rider):
            ahead = run.pending is not None and run.pending.rider is not rider
            got = read(rider)
            if got is not None:
                self.read.append((self.step, rider.prep.req.id, ahead))
            return got

        mixed.forward, mixed.read = spy_forward, spy_read

    def run(self, outs: dict, lps: dict | None = None, limit: int = 200) -> None:
        for _ in range(limit):
            if not self.eng.has_unfinished():
                return
            self.once(outs, lps)
        raise AssertionError("the engine did not finish")

    def once(self, outs: dict, lps: dict | None = None) -> dict:
        """One engine step; {request id: its new tokens} of this step."""
        got = {}
        for o in self.eng.step():
            got[o.request_id] = o.new_token_ids
            if o.new_token_ids:
                self.first.setdefault(o.request_id, self.step)
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
            if lps is not None:
                lps.setdefault(o.request_id, []).extend(o.new_logprobs or [])
        self.step += 1
        return got


def _arrive(eng, trace, params, outs, lps=None):
    """A row decoding (chained), then PROMPT arriving; returns (row id, prompt id)."""
    a = eng.add_request(ROW, LONG)
    trace.once(outs, lps)
    trace.once(outs, lps)
    return a, eng.add_request(PROMPT, params)


def _clean(eng):
    assert not eng.has_unfinished() and eng.runner.mixed.unread == []
    eng.prefix.flush()
    eng.prefix.check()
    assert eng.cache_stats()["pool_used"] == 0 and not eng.prefix.holds


@pytest.mark.parametrize("chain", [True, False])
def test_the_first_token_is_read_with_the_launch_it_rode(model_dir, chain):
    """Chained, the token comes one step after the launch, read once the next launch is queued;
    unchained, in the launch's own step. Seeded sampling and logprobs equal the separate steps',
    and the prompt's tokens are counted once."""
    path = model_dir("llama")
    params = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.8, seed=3, logprobs=2)
    res, first = {}, {}
    for mixed in (True, False):
        eng = _engine(path, mixed, chain=chain)
        trace, outs, lps = Trace(eng), {}, {}
        a, r = _arrive(eng, trace, params, outs, lps)
        req = eng.request(r)
        trace.once(outs, lps)
        got = trace.once(outs, lps)  # its final chunk runs or rides this step
        if mixed:
            assert trace.launched == [(2, r, False), (3, r, True)]
            if chain:  # computed, first token unread: recorded, never scheduled again, not a row yet
                assert r not in got and eng.scheduler.in_flight() == [req]
                assert req.prefilled == len(PROMPT) and req.status.value == "prefilling"
        trace.run(outs, lps)
        if mixed:
            assert trace.read == ([(4, r, True)] if chain else [(3, r, False)])
        assert trace.joined.index(r) == 1 and eng.stats["computed_prompt_tokens"] == len(ROW) + len(PROMPT)
        res[mixed], first[mixed] = ([outs[a], outs[r]], [lps[a], lps[r]]), trace.first[r]
    assert res[True] == res[False]
    assert first == {True: 4 if chain else 3, False: 3}  # TTFT + one decode step, chained


def test_the_scheduler_skips_a_computed_prompt_and_counts_its_row():
    from graphc.runtime.request import Request
    from graphc.runtime.scheduler import Scheduler

    sched = Scheduler(max_batch=2, prefill_chunk=64)
    reqs = [Request([1 + i] * 10, SamplingParams()) for i in range(3)]
    for r in reqs:
        sched.add(r)
    sched.advance(reqs[0], 10)  # launched riding: computed, first token unread
    assert sched.in_flight() == [reqs[0]]
    out = sched.schedule()
    assert out.prefill == [(reqs[1], 10)]  # one slot left for the prompts behind it
    sched.advance(reqs[1], 10)
    sched.started(reqs[1])
    assert sched.in_flight() == [reqs[0]] and sched.schedule().prefill == []
    sched.started(reqs[0])
    assert sched.in_flight() == []


def test_an_abort_before_the_token_is_read(model_dir):
    """No read, no store from the dropped caches, no hold or pool slot left; the row goes on."""
    path = model_dir("llama")
    eng = _engine(path)
    trace, outs = Trace(eng), {}
    stores = []
    spill = eng.runner.prefix_io.spill_prompt
    eng.runner.prefix_io.spill_prompt = lambda req: (stores.append(req.id), spill(req))
    a, r = _arrive(eng, trace, SamplingParams(max_tokens=5, ignore_eos=True), outs)
    trace.once(outs)
    trace.once(outs)
    assert eng.scheduler.in_flight() and eng.runner.mixed.unread
    assert eng.abort(r)
    assert eng.runner.mixed.unread == [] and r not in eng.prefix.holds
    trace.run(outs)
    assert trace.read == [] and r not in stores and r not in trace.joined
    assert outs[a] == reference_greedy(eng.model, ROW, LONG.max_tokens) and r not in outs
    _clean(eng)


@pytest.mark.parametrize("how", ["abort", "end"])
def test_every_row_leaving_under_a_rider_still_reads_it(model_dir, how):
    """The chain is dropped when the batch empties; the chunk that rode its last launch is read at
    the step's end instead of being lost. "end": the row's last token is read in the step that
    launched the chunk (found by trying lengths); "abort": the row is aborted then."""
    path = model_dir("llama")
    want = reference_greedy(_engine(path).model, PROMPT, 5)
    hits = 0
    for m in ([LONG.max_tokens] if how == "abort" else range(2, 7)):
        eng = _engine(path)
        trace, outs = Trace(eng), {}
        row = SamplingParams(max_tokens=m, ignore_eos=True)
        a = eng.add_request(ROW, row)
        trace.once(outs)
        trace.once(outs)
        r = eng.add_request(PROMPT, SamplingParams(max_tokens=5, ignore_eos=True))
        trace.once(outs)
        trace.once(outs)
        if how == "abort":
            eng.abort(a)
        stranded = eng.runner.pending is None and bool(eng.runner.mixed.unread)
        hits += stranded
        trace.run(outs)
        assert outs[r] == want, m
        if stranded:
            assert [(s, i) for s, i, _ in trace.read] == [(4, r)]
        _clean(eng)
    assert hits >= 1


def test_a_fault_while_the_token_is_unread_recomputes_the_request(model_dir, monkeypatch):
    """The step after the launch fails: runner.reset drops the rider, and the request whose
    prompt rode is reset with the rows and recomputed (its tokens are still mlx-lm's)."""
    path = model_dir("llama")
    eng = _engine(path)
    trace, outs = Trace(eng), {}
    a, r = _arrive(eng, trace, SamplingParams(max_tokens=5, ignore_eos=True), outs)
    trace.once(outs)
    trace.once(outs)
    assert eng.scheduler.in_flight()
    real, calls = host_read.read, {"n": 0}

    def failing(host):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected read failure")
        return real(host)

    monkeypatch.setattr(host_read, "read", failing)
    trace.run(outs)
    assert calls["n"] > 1 and eng.stats["step_faults"] == 1 and trace.read == []
    assert eng.stats["computed_prompt_tokens"] > len(ROW) + len(PROMPT)  # recomputed
    assert outs[r] == reference_greedy(eng.model, PROMPT, 5)
    assert outs[a] == reference_greedy(eng.model, ROW, LONG.max_tokens)
    _clean(eng)


@pytest.mark.parametrize("end", ["max_tokens", "eos", "stop_token"])
def test_a_first_token_that_ends_the_request_never_joins(model_dir, end):
    path = model_dir("llama")
    eng = _engine(path)
    first = reference_greedy(eng.model, PROMPT, 1)[0]
    params = {"max_tokens": SamplingParams(max_tokens=1, ignore_eos=True),
              "eos": SamplingParams(max_tokens=8),
              "stop_token": SamplingParams(max_tokens=8, stop_token_ids=[first])}[end]
    if end == "eos":
        eng.eos_token_ids.add(first)
    trace, outs = Trace(eng), {}
    a, r = _arrive(eng, trace, params, outs)
    req = eng.request(r)
    trace.run(outs)
    assert [(s, i) for s, i, _ in trace.read] == [(4, r)]
    assert outs[r] == [first] and r not in trace.joined
    assert req.finish_reason == ("length" if end == "max_tokens" else "stop")
    assert outs[a] == reference_greedy(eng.model, ROW, LONG.max_tokens)
    _clean(eng)


def test_grammar_prompts_never_ride_and_speculative_ones_keep_their_tokens(model_dir):
    """A grammar row needs the host for its first token's mask: its chunks run alone. A verify step
    carries no chunk (it runs alone after it); a speculative request's prompt may ride a plain
    launch (the draft model, if any, prefills when the row first drafts). Tokens are the target's."""
    path = model_dir("llama")
    eng = _engine(path)
    trace, outs = Trace(eng), {}
    _arrive(eng, trace, SamplingParams(max_tokens=6, grammar=Grammar.regex("[a-z]{2,4}")), outs)
    trace.run(outs)
    assert trace.launched == [] and eng.runner.mixed.steps == 0
    spec = SamplingParams(max_tokens=8, ignore_eos=True, speculative="prompt_lookup", num_draft_tokens=3)
    for rows_speculate in (False, True):
        res = {}
        for mixed in (True, False):
            eng = _engine(path, mixed, spec_max_tokens=64)
            trace, outs = Trace(eng), {}
            a = eng.add_request(ROW + ROW, spec if rows_speculate else LONG)  # repeats: drafts to verify
            trace.once(outs)
            trace.once(outs)
            r = eng.add_request(PROMPT, spec)
            trace.run(outs)
            res[mixed] = (outs[a], outs[r])
            if mixed and not rows_speculate:
                assert [f for _, i, f in trace.launched if i == r] == [False, True]
            if rows_speculate:
                assert eng.stats["spec_steps"] > 0
        assert res[True] == res[False] and res[True][1] == reference_greedy(eng.model, PROMPT, 8)
