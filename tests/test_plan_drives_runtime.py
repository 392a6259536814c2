"""The runtime does what the lowered plan says: chain safety, scoring through graphs/score.yaml."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from helpers import random_prompts, reference_greedy, reference_logits

POLICY = '''
from graphc.runtime.cache import register_policy
from graphc.runtime.cache.full import FullPolicy


@register_policy("full_host_sync")
class HostSyncPolicy(FullPolicy):
    """`full`, but declaring that it needs the host between decode steps."""
    chain_safe = False
'''


def test_policy_that_is_not_chain_safe_breaks_the_chain(model_dir, tmp_path):
    (tmp_path / "host_sync.py").write_text(POLICY)
    from graphc.compiler.parse import GRAPHS_DIR

    text = (GRAPHS_DIR / "dense_noprefix.yaml").read_text().replace(
        "inputs: [tokens]", "plugins: [host_sync.py]\ninputs: [tokens]", 1).replace(
        "{policy: full}", "{policy: full_host_sync}")
    (tmp_path / "g.yaml").write_text(text)
    d = model_dir("llama")
    eng = Engine.load(d, graph=str(tmp_path / "g.yaml"))
    plan = eng.compiled.plan("decode")
    assert not plan.chain_safe and any("full_host_sync" in n for n in plan.chain_notes)
    assert eng.runner.chain is False
    prompts = random_prompts(2, eng.vocab_size, [6, 11], seed=2)
    for p in prompts:
        eng.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
        assert eng.runner.pending is None  # nothing was queued ahead of the host
    chained = Engine.load(d, graph="dense_noprefix")
    assert chained.runner.chain is True
    res = chained.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    assert [r.token_ids for r in res] == [reference_greedy(chained.model, p, 8) for p in prompts]


@pytest.fixture(scope="module", params=["fast", "generic"])
def engine(model_dir, request):
    return Engine.load(model_dir("llama"), lowering=request.param)


def test_score_matches_the_models_logprobs(engine):
    prompts = random_prompts(3, engine.vocab_size, [5, 1, 12], seed=9)
    conts = random_prompts(3, engine.vocab_size, [4, 7, 1], seed=10)
    results = engine.score_many(list(zip(prompts, conts)))  # one left-padded forward
    for p, c, r in zip(prompts, conts, results):
        ref = np.array(reference_logits(engine.model, p + c))
        lp = ref - np.logaddexp.reduce(ref, axis=-1, keepdims=True)
        want = [lp[len(p) - 1 + i, t] for i, t in enumerate(c)]
        np.testing.assert_allclose(r.logprobs, want, atol=1e-4)
        assert r.greedy == [int(ref[len(p) - 1 + i].argmax()) == t for i, t in enumerate(c)]
        assert r.token_ids == c and r.prompt_tokens == len(p)
        assert abs(r.total - sum(want)) < 1e-3


def test_score_of_the_greedy_continuation_is_greedy(engine):
    p = random_prompts(1, engine.vocab_size, [8], seed=4)[0]
    [gen] = engine.generate([p], SamplingParams(max_tokens=5, ignore_eos=True, logprobs=0))
    r = engine.score(p, gen.token_ids)
    assert r.is_greedy
    np.testing.assert_allclose(r.logprobs, [lp["logprob"] for lp in gen.logprobs], atol=1e-4)


def test_score_plan_has_no_sampling(engine):
    plan = engine.oneshot("score", "scores").compiled.plan("prefill")
    assert [s.op for s in plan.steps] == ["embed", "attention", "logits", "score"]
    assert plan.sample_method is None and plan.edits is None
