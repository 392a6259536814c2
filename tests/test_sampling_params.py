"""SamplingParams validation and the tensor pack's host flags."""

import math

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime.sampling import SamplingParams, SamplingTensors


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(temperature=math.nan), "temperature must be a finite number"),
        (dict(top_k=-1), "top_k must be an integer in 0..2147483647"),
        (dict(top_k=2**31), "top_k must be an integer in 0..2147483647"),
        (dict(top_k=2.5), "top_k must be an integer"),
        (dict(min_p=1.2), r"min_p must be in \[0, 1\]"),
        (dict(seed=1.5), "seed must be None or an integer"),
        (dict(seed=2**64), "seed must be None or an integer"),
        (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
        (dict(frequency_penalty=3.0), r"frequency_penalty must be in \[-2, 2\]"),
        (dict(presence_penalty=-2.5), r"presence_penalty must be in \[-2, 2\]"),
        (dict(logit_bias={1: 101.0}), r"logit_bias\[1\] must be in \[-100, 100\]"),
        (dict(logit_bias={-1: 1.0}), "logit_bias keys must be token ids"),
        (dict(banned_token_ids=(3, -2)), "banned_token_ids must hold token ids"),
        (dict(min_tokens=-1), "min_tokens must be an integer in 0..2147483647"),
        (dict(min_tokens=2**31), "min_tokens must be an integer in 0..2147483647"),
        (dict(max_tokens=2**31), "max_tokens must be an integer in 0..2147483647"),
        (dict(logprobs=21), r"logprobs must be None or an integer in 0..20"),
        (dict(prompt_logprobs=-1), "prompt_logprobs must be None"),
        (dict(logprob_token_ids=("a",)), "logprob_token_ids must hold token ids"),
    ],
)
def test_validate_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs).validate()


def test_defaults_are_valid_and_greedy():
    p = SamplingParams().validate()
    assert p.greedy and p.temperature == 0.0 and p.top_k == 0 and p.logprobs is None
    assert SamplingParams(temperature=0.7, top_k=1).greedy


def test_json_style_logit_bias_keys_and_hashing():
    p = SamplingParams(logit_bias={"7": 2})
    assert p.logit_bias == {7: 2.0}
    assert p == SamplingParams(logit_bias={7: 2.0})
    hash(p)  # usable as a dict key even though it holds a dict
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={"x": 1})


def test_build_checks_vocab_range():
    with pytest.raises(ValueError, match="token id 10 is out of range for a vocabulary of 10"):
        SamplingTensors.build([SamplingParams(banned_token_ids=(10,))], 10)
    with pytest.raises(ValueError, match="top_p"):
        SamplingTensors.build([SamplingParams(top_p=2.0)], 10)


def test_batch_flags_name_the_host_work_a_batch_needs():
    V = 100
    st = SamplingTensors.build([SamplingParams()] * 3, V)
    assert st.all_greedy and not st.has_penalties and not st.needs_edits and not st.want_logprobs and st.chain_safe
    st = SamplingTensors.build(
        [
            SamplingParams(temperature=1.0, seed=5),
            SamplingParams(temperature=1.0, top_k=50, top_p=0.9, logprobs=3),
            SamplingParams(temperature=1.0, top_p=0.9, frequency_penalty=0.1, min_tokens=2),
            SamplingParams(logit_bias={1: 1.0}, logprob_token_ids=(4, 5)),
        ],
        V,
        eos_token_ids=[0],
    )
    d = st.describe()
    assert [g["kind"] for g in d["groups"]] == ["greedy", "plain", "candidates", "full"]
    assert d["groups"][2]["filters"] == ["top_k", "top_p"] and d["groups"][2]["width"] == 64
    assert st.needs_full_sort and st.has_penalties and not st.has_repetition_penalty
    assert st.has_static_edits and st.has_min_tokens and st.want_logprobs
    assert st.top_logprobs == 3 and st.logprob_token_counts == (0, 0, 0, 2)
    assert st.any_seeded and not st.all_seeded
    assert np.array(st.inverse_perm).tolist() == [1, 2, 3, 0]
    assert st.seed_lo.dtype == mx.uint32 and st.temperature.dtype == mx.float32
