"""The warm-up with a disk tier (runtime/warmup.py, DiskTier.scratch): it runs its requests
against a scratch folder, so the client's folder after a warm-up holds exactly what it held
before, and a conversation shorter than one block still resumes from its tail after a restart
whose server warmed up (a tail file is replaced by the next sequence ending on its chain: the
warm-up's own short prompt used to take the place of the conversation's)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams, warmup
from graphc.runtime.cache.disk_files import SUFFIX

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
B = 64  # one block: longer than the warm-up's 16-token prompts, so the turn below is sub-block


def folder_state(eng: Engine) -> dict:
    eng.disk_tier.flush()
    return {f.name: f.read_bytes() for f in sorted(eng.disk_tier.store.dir.glob("*" + SUFFIX))}


def load(model, folder) -> Engine:
    return Engine.load(model, prefill_chunk=32, kv_cache_dir=str(folder), kv_cache_block_tokens=B,
                       kv_cache_disk_read="always")


@pytest.fixture(scope="module", params=["llama", "qwen3_next"])
def arch_dir(request, model_dir):
    return model_dir(request.param)


def test_warm_up_leaves_the_folder_as_it_was(arch_dir, tmp_path):
    turn = np.random.default_rng(1).integers(3, 1000, 40).tolist()
    first = load(arch_dir, tmp_path)
    first.generate([turn], GREEDY)
    before = folder_state(first)
    assert before, "the turn's tail was written"
    second = load(arch_dir, tmp_path)
    second.warm_up(shapes=True, agent=True)
    assert folder_state(second) == before
    assert second.prefix.tree.tokens == 0  # and the memory tier forgot the warm-up's prompts
    assert second.disk_tier.counters["disk_spilled_tails"] == 0


def test_sub_block_conversation_resumes_after_a_warmed_restart(arch_dir, tmp_path):
    rng = np.random.default_rng(2)
    turn = rng.integers(3, 1000, 30).tolist()
    first = load(arch_dir, tmp_path)
    answer = first.generate([turn], GREEDY)[0].token_ids
    first.disk_tier.flush()
    nxt = turn + answer + rng.integers(3, 1000, 6).tolist()
    second = load(arch_dir, tmp_path)
    second.warm_up(shapes=True, agent=True)
    out = second.generate([nxt], GREEDY)[0]
    assert out.cached_tokens > 0, "the next turn resumed from the conversation's tail on disk"
    assert second.cache_stats()["disk_hits"] == 1
    cold = Engine.load(arch_dir, prefill_chunk=32, prefix_cache=False).generate([nxt], GREEDY)[0]
    assert out.token_ids == cold.token_ids


def test_agent_turn_reads_back_from_the_scratch_tier(model_dir, tmp_path):
    eng = load(model_dir("llama"), tmp_path)
    with eng.disk_tier.scratch(str(tmp_path / "scratch")) as scratch:
        assert warmup.agent_turn(eng, random.Random(0), eng.vocab_size)
        assert scratch.counters["disk_loaded_blocks"] >= 1 and scratch.counters["disk_loaded_tails"] >= 1
    assert eng.prefix.disk is eng.disk_tier and eng.disk_tier.counters["disk_loaded_blocks"] == 0
    assert folder_state(eng) == {}
