"""Seeded tokens recorded from the sampler as it was before the fused selection path
(main at abee9cd), checked against today's code: a rewrite of token selection must not
change what a seeded row draws.

`tests/data/sampling_golden.json` was written by `python tests/test_sampling_golden.py`
on that commit. Rerun it only for a deliberate change of the sampling contract (and say
so in the commit): the point of the file is that it does not follow the code.

Cases: selection alone (`select_tokens`) on [B, V] logits at the Llama-3 vocabulary
(bf16 with many exact ties, and float32), a 5,000 vocabulary (not a multiple of the
candidate block) with plain / full-sort rows in the batch, a 1,000 vocabulary with
rounded logits; and whole `Engine.generate` calls on the tiny llama, chained, mixed
greedy and sampled rows.
"""

from __future__ import annotations

import json
import pathlib
import sys

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime.sampling import SamplingParams as P
from graphc.runtime.sampling import SamplingTensors, select_tokens

GOLDEN = pathlib.Path(__file__).parent / "data" / "sampling_golden.json"
STEPS = 3


def select_cases() -> dict:
    mixed = [P(), P(temperature=0.8, top_p=0.9, top_k=50, seed=11), P(temperature=1.0, top_k=20, seed=12),
             P(temperature=0.7, top_k=64, min_p=0.05, seed=13), P(temperature=1.3, top_k=2, seed=14),
             P(temperature=0.9, top_k=1, seed=15), P(temperature=0.5, top_k=33, top_p=0.5, seed=-16),
             P(temperature=2.0, top_k=1000, top_p=0.97, min_p=0.01, seed=2**63 + 5)]
    bench = [P(temperature=0.8, top_p=0.9, top_k=50, seed=100 + i) for i in range(64)]
    withplain = mixed + [P(temperature=0.9, seed=21), P(temperature=1.1, top_p=0.95, seed=22),
                         P(temperature=0.7, min_p=0.1, seed=23), P(temperature=1.0, top_k=5000, seed=24)]
    topk = [p for p in mixed if p.top_k <= 64]
    unseeded = [P(), P(temperature=0.8, top_p=0.9, top_k=50), P(temperature=1.0, top_k=20, seed=31),
                P(temperature=0.7, top_k=40, min_p=0.05)]
    return {  # name: (vocab, logits dtype, one params per row, tie step of the logits or 0)
        "v128256_bf16_mixed64": (128256, "bfloat16", (mixed * 8)[:64], 0),
        "v128256_f32_bench64": (128256, "float32", bench, 0),
        "v5000_f32_withplain": (5000, "float32", withplain, 0),
        "v1000_ties_mixed": (1000, "float32", mixed + mixed[::-1], 0.25),
        # greedy and top-k rows only (the fused path): a vocabulary of 1,000 with ties (no
        # block search), 40,000 in bf16 (block search, not a multiple of the block)
        "v1000_ties_topk": (1000, "float32", topk * 3, 0.25),
        "v40000_bf16_topk": (40000, "bfloat16", topk * 2, 0),
        # rows without a seed draw from the key each step gets: recorded too (every row)
        "v128256_bf16_unseeded": (128256, "bfloat16", unseeded * 4, 0),
    }


def _logits(v, dtype, b, step, tie, case):
    rng = np.random.default_rng(case * 1000 + step)
    x = rng.normal(0, 2.0, (b, v)).astype(np.float32)
    if tie:
        x = np.round(x / tie) * tie
    return mx.array(x).astype(getattr(mx, dtype))


def _deterministic(p) -> bool:  # given the logits alone (an unseeded row also needs the key)
    return p.seed is not None or p.temperature == 0 or p.top_k == 1


def run_select(name: str) -> list:
    """Tokens of the deterministic rows (seeded or greedy), one list per step."""
    names = list(select_cases())
    v, dtype, params, tie = select_cases()[name]
    st = SamplingTensors.build(params, v)
    out = []
    for s in range(STEPS):
        x = _logits(v, dtype, len(params), s, tie, names.index(name))
        pos = mx.arange(len(params), dtype=mx.int32) * 7 + 100 + s
        t = np.array(select_tokens(x, st, pos, mx.random.key(s))).tolist()
        every = name.endswith("_unseeded")
        out.append([t[r] for r, p in enumerate(params) if every or _deterministic(p)])
    return out


ENGINE_PROMPTS = [[7, 8, 9, 10, 11], [20, 21, 22], [5, 6, 7, 8, 9, 10, 11, 12], [30, 31], [40, 41, 42, 43],
                  [50, 51, 52], [60, 61, 62, 63], [70, 71, 72], [80, 81, 82, 83, 84, 85]]


def engine_params() -> list:
    return [P(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=1234, ignore_eos=True),
            P(max_tokens=12, ignore_eos=True),
            P(max_tokens=9, temperature=1.0, top_k=20, seed=7, ignore_eos=True),
            P(max_tokens=12, temperature=0.7, top_k=64, min_p=0.05, seed=8, ignore_eos=True),
            P(max_tokens=5, temperature=1.2, top_k=3, top_p=0.8, seed=9, ignore_eos=True),
            P(max_tokens=12, temperature=0.9, seed=10, ignore_eos=True),
            P(max_tokens=12, temperature=1.1, top_p=0.95, seed=11, ignore_eos=True),
            P(max_tokens=16, temperature=3.0, top_k=50, top_p=0.95, seed=12, ignore_eos=True),
            P(max_tokens=16, temperature=2.5, top_k=200, min_p=0.02, seed=13, ignore_eos=True)]


def run_engine(model_path) -> dict:
    from graphc.runtime import Engine

    eng = Engine.load(model_path, prefill_chunk=8)
    whole = [r.token_ids for r in eng.generate(ENGINE_PROMPTS, engine_params())]
    # Only greedy / top-k rows (the fused candidate path with no other group in the batch).
    cand = [0, 1, 2, 3, 4, 7, 8]
    part = [r.token_ids for r in eng.generate([ENGINE_PROMPTS[i] for i in cand],
                                              [engine_params()[i] for i in cand])]
    return {"mixed": whole, "candidates_only": part}


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", list(select_cases()))
def test_select_tokens_match_recorded(golden, name):
    assert run_select(name) == golden["select"][name]


def test_engine_generate_matches_recorded(golden, model_dir):
    assert run_engine(model_dir("llama")) == golden["engine"]


if __name__ == "__main__":  # record (see the module doc before doing this)
    import tempfile

    from graphc.compiler.modelgen import make_model

    data = {"recorded_by": " ".join(sys.argv), "select": {n: run_select(n) for n in select_cases()},
            "engine": run_engine(make_model("llama", tempfile.mkdtemp()))}
    GOLDEN.write_text(json.dumps(data) + "\n")
    print(f"wrote {GOLDEN}")
