"""Sampling through Engine.generate: seeded determinism across batches/chains/chunks, penalties and
logprobs against mlx-lm's own forward, edits that exclude tokens everywhere, min_tokens, processors."""

from __future__ import annotations

import attrs
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_logits_processors

from graphc.runtime import Engine, SamplingParams
from helpers import random_prompts, reference_greedy, reference_logits

SAMPLED = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)


@pytest.fixture(scope="module")
def mdir(model_dir):
    return model_dir("llama")


@pytest.fixture(scope="module")
def engine(mdir):
    return Engine.load(mdir, prefill_chunk=8)


def test_seeded_rows_do_not_depend_on_batch_position_chain_or_chunking(mdir, engine):
    prompt = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]
    alone = engine.generate([prompt], SAMPLED)[0].token_ids
    others = random_prompts(6, engine.vocab_size, [3, 20, 5, 9, 2, 14], seed=9)
    mixed = others[:3] + [prompt] + others[3:]
    params = [SamplingParams(max_tokens=n, temperature=1.0, ignore_eos=True) for n in (5, 16, 9)]
    params += [SAMPLED] + [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 12, 16)]
    in_batch = engine.generate(mixed, params)[3].token_ids
    unchained = Engine.load(mdir, prefill_chunk=64, chain=False).generate([prompt], SAMPLED)[0].token_ids
    assert alone == in_batch == unchained
    assert len(set(alone)) > 1  # sampled, not a constant stream
    other_seed = engine.generate([prompt], [attrs.evolve(SAMPLED, seed=99)])[0].token_ids
    assert other_seed != alone


def test_unseeded_rows_vary(engine):
    p = SamplingParams(max_tokens=12, temperature=1.5, ignore_eos=True)
    a, b = engine.generate([[5, 6, 7], [5, 6, 7]], p)
    assert a.token_ids != b.token_ids


def test_repetition_penalty_matches_mlx_lm_processor(engine):
    prompt = [21, 22, 23, 24]
    ours = engine.generate([prompt], SamplingParams(max_tokens=24, repetition_penalty=1.5, penalize_prompt=True,
                                                    ignore_eos=True))[0].token_ids
    procs = make_logits_processors(repetition_penalty=1.5, repetition_context_size=10_000)
    ref = [int(t) for t, _ in generate_step(mx.array(prompt), engine.model, max_tokens=24, logits_processors=procs,
                                            prompt_cache=make_prompt_cache(engine.model))]
    assert ours == ref
    assert ours != reference_greedy(engine.model, prompt, 24)  # the penalty changed something


def test_penalties_are_exact_when_chained(mdir):
    prompts = random_prompts(4, 1024, [3, 11, 6, 2], seed=4)
    ps = [SamplingParams(max_tokens=20, frequency_penalty=1.0, presence_penalty=0.5, ignore_eos=True),
          SamplingParams(max_tokens=20, repetition_penalty=1.3, ignore_eos=True),
          SamplingParams(max_tokens=7, ignore_eos=True),
          SamplingParams(max_tokens=20, frequency_penalty=2.0, temperature=0.7, seed=5, ignore_eos=True)]
    chained = Engine.load(mdir, chain=True).generate(prompts, ps)
    unchained = Engine.load(mdir, chain=False).generate(prompts, ps)
    alone = [Engine.load(mdir).generate([p], [sp])[0] for p, sp in zip(prompts, ps)]
    assert [r.token_ids for r in chained] == [r.token_ids for r in unchained] == [r.token_ids for r in alone]


def test_logprobs_match_a_numpy_reference(engine):
    prompt = [31, 32, 33, 34, 35]
    [res] = engine.generate([prompt], SamplingParams(max_tokens=6, logprobs=4, logprob_token_ids=(3, 4),
                                                     ignore_eos=True))
    logits = np.array(reference_logits(engine.model, prompt + res.token_ids))
    for i, (tok, lp) in enumerate(zip(res.token_ids, res.logprobs)):
        row = logits[len(prompt) - 1 + i].astype(np.float64)
        ref = row - np.log(np.exp(row - row.max()).sum()) - row.max()
        assert lp["logprob"] == pytest.approx(ref[tok], abs=2e-4)
        top = sorted(range(len(ref)), key=lambda j: (-ref[j], j))[:4]
        assert [t for t, _ in lp["top"]] == top
        assert [v for _, v in lp["top"]] == pytest.approx([ref[j] for j in top], abs=2e-4)
        assert [t for t, _ in lp["requested"]] == [3, 4]
        assert [v for _, v in lp["requested"]] == pytest.approx([ref[3], ref[4]], abs=2e-4)


def test_prompt_logprobs_match_reference_across_chunks(engine):
    prompt = random_prompts(1, engine.vocab_size, [21], seed=8)[0]  # 3 chunks of 8
    [res] = engine.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=2))
    logits = np.array(reference_logits(engine.model, prompt)).astype(np.float64)
    assert res.prompt_logprobs[0] is None and len(res.prompt_logprobs) == len(prompt)
    for i in range(1, len(prompt)):
        row = logits[i - 1]
        ref = row - row.max() - np.log(np.exp(row - row.max()).sum())
        got = res.prompt_logprobs[i]
        assert got["token"] == prompt[i] and got["logprob"] == pytest.approx(ref[prompt[i]], abs=2e-4)
        assert len(got["top"]) == 2


def test_banned_token_is_excluded_from_greedy_sampling_and_logprobs(engine):
    prompt = [41, 42, 43]
    first = reference_greedy(engine.model, prompt, 1)[0]
    [g] = engine.generate([prompt], SamplingParams(max_tokens=8, banned_token_ids=(first,),
                                                   logprob_token_ids=(first,), ignore_eos=True))
    assert first not in g.token_ids
    assert all(lp["requested"][0][1] == -np.inf for lp in g.logprobs)
    [s] = engine.generate([prompt], SamplingParams(max_tokens=30, temperature=2.0, seed=3, banned_token_ids=(first,),
                                                   ignore_eos=True))
    assert first not in s.token_ids


def test_logit_bias_forces_a_token(engine):
    [r] = engine.generate([[5, 6]], SamplingParams(max_tokens=5, logit_bias={77: 100.0}, ignore_eos=True))
    assert r.token_ids == [77] * 5


def test_min_tokens_holds_eos_back(engine):
    eos = min(engine.eos_token_ids)
    p = SamplingParams(max_tokens=20, logit_bias={eos: 50.0}, min_tokens=5)
    [r] = engine.generate([[9, 10, 11]], p)
    assert eos not in r.token_ids[:5] and r.token_ids[5] == eos and len(r.token_ids) == 6
    assert r.finish_reason == "stop"


def test_python_logits_processor_runs_and_breaks_the_chain(engine):
    def only_42(ids, logits):
        out = mx.full(logits.shape, -mx.inf)
        return mx.where(mx.arange(logits.shape[-1]) == 42, 0.0, out)

    rid = engine.add_request([5, 6, 7], SamplingParams(max_tokens=6, logits_processors=(only_42,), ignore_eos=True))
    other = engine.add_request([8, 9], SamplingParams(max_tokens=6, ignore_eos=True))
    toks = {rid: [], other: []}
    while engine.has_unfinished():
        for o in engine.step():
            toks[o.request_id] += o.new_token_ids
        assert engine.runner.pending is None or all(r.params.chain_safe for r in engine.runner.pending.rows)
    assert toks[rid] == [42] * 6
    assert toks[other] == reference_greedy(engine.model, [8, 9], 6)


def test_mlx_lm_logits_processors_work_as_is(engine):
    prompt = [21, 22, 23, 24]
    procs = tuple(make_logits_processors(repetition_penalty=1.5, repetition_context_size=10_000))
    [r] = engine.generate([prompt], SamplingParams(max_tokens=16, logits_processors=procs, ignore_eos=True))
    ref = [int(t) for t, _ in generate_step(mx.array(prompt), engine.model, max_tokens=16, logits_processors=list(procs),
                                            prompt_cache=make_prompt_cache(engine.model))]
    assert r.token_ids == ref


def test_a_failing_logits_processor_ends_only_its_own_request(engine):
    def boom(ids, logits):
        if len(ids) > 5:
            raise RuntimeError("no more")
        return logits

    bad = SamplingParams(max_tokens=10, logits_processors=(boom,), ignore_eos=True)
    good = SamplingParams(max_tokens=10, ignore_eos=True)
    res = engine.generate([[5, 6, 7], [8, 9]], [bad, good])
    assert res[0].finish_reason == "error" and "no more" in res[0].error
    assert len(res[0].token_ids) == 3  # tokens chosen before the failure stay
    assert res[1].finish_reason == "length" and res[1].token_ids == reference_greedy(engine.model, [8, 9], 10)
    assert not engine.has_unfinished() and engine.runner.rows == []


def test_an_engine_seed_fixes_the_draws_of_rows_without_a_seed(model_dir):
    """An unseeded request samples with a noise seed drawn from the Engine's generator at
    add_request: the same Engine seed gives the same unseeded tokens, another seed other tokens,
    and a second call of one Engine new ones."""
    from graphc.runtime.engine import Engine
    from graphc.runtime.params import SamplingParams

    d = model_dir("llama")
    prompts = [[5, 9, 13, 2], [7, 7, 1], [3, 4, 5, 6, 8, 9], [11, 12]]
    params = SamplingParams(max_tokens=10, temperature=1.5, top_k=40, ignore_eos=True)  # no seed

    def run(eng):
        return [r.token_ids for r in eng.generate(prompts, params)]

    a, b, c = Engine.load(d, seed=3), Engine.load(d, seed=3), Engine.load(d, seed=4)
    first = run(a)
    assert first == run(b)
    assert first != run(c)
    assert run(a) != first  # new requests, new noise seeds


def test_an_unseeded_row_samples_as_its_noise_seed_would(mdir):
    """The contract (docs/sampling.md, "Seeds"): a sampled request without a seed draws exactly what
    it would draw with `seed=` its noise seed, in a chained batch beside other rows; greedy rows
    keep none."""
    eng = Engine.load(mdir, seed=5)
    unseeded = SamplingParams(max_tokens=10, temperature=1.3, top_k=40, top_p=0.95, ignore_eos=True)
    prompts = [[5, 9, 13, 2], [7, 7, 1], [3, 4, 5, 6, 8, 9]]
    ids = [eng.add_request(p, unseeded if i != 1 else SamplingParams(max_tokens=10, ignore_eos=True))
           for i, p in enumerate(prompts)]
    reqs = [eng.request(i) for i in ids]
    while eng.has_unfinished():
        eng.step()
    got = [r.output_ids for r in reqs]
    seeds = [r.noise_seed for r in reqs]
    assert len(set(seeds)) == 3 and all(isinstance(s, int) and 0 <= s < 2**64 for s in seeds)
    alone = [Engine.load(mdir).generate([prompts[i]], attrs.evolve(unseeded, seed=seeds[i]))[0].token_ids
             for i in (0, 2)]
    assert [got[0], got[2]] == alone
    assert got[1] == reference_greedy(eng.model, prompts[1], 10)
    assert eng.runner.sampler.tensors([reqs[0], reqs[2]]).all_seeded  # no step key, no fresh words


def test_min_tokens_holds_when_its_row_joins_a_chained_batch_that_had_none(engine):
    """Steps without a min_tokens row carry no generated-token counts (nothing reads them); a row
    with min_tokens that joins mid-batch gets them from the host and still holds EOS back."""
    eos = min(engine.eos_token_ids)
    free = SamplingParams(max_tokens=30, temperature=0.9, top_k=20, seed=3, ignore_eos=True)
    held = SamplingParams(max_tokens=20, logit_bias={eos: 50.0}, min_tokens=5)
    first = engine.request(engine.add_request([11, 12, 13], free))
    for _ in range(4):  # the first row decodes, chained, with no min_tokens in its batch
        engine.step()
    assert engine.runner.pending is not None and engine.runner.pending.sampling.n_generated is None
    r = engine.request(engine.add_request([9, 10, 11], held))
    faults = engine.stats.get("step_faults", 0)
    while engine.has_unfinished():
        engine.step()
    assert engine.stats.get("step_faults", 0) == faults  # no step failed and was isolated
    assert eos not in r.output_ids[:5] and r.output_ids[5] == eos and len(r.output_ids) == 6
    assert len(first.output_ids) == 30
