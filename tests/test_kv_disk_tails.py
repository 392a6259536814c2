"""The disk tier's tails (runtime/cache/disk_tails.py): after a restart, a growing conversation
resumes where its previous turn ended, not at the last full block before it, at the default
block size (256 tokens), on dense and hybrid models; output equal to a cold run. A tail that
does not check out is skipped and the hit falls back to the full blocks."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache.disk_files import decode_block
from graphc.runtime.cache.disk_tails import TAIL
from graphc.runtime.cache.disk_tier import DEFAULT_BLOCK_TOKENS as B
from helpers import reference_greedy

ONE = SamplingParams(max_tokens=1)
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def conversation(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 1000, n).tolist()


def load(model, folder) -> Engine:
    return Engine.load(model, prefill_chunk=128, max_total_tokens=4096, kv_cache_dir=str(folder),
                       kv_cache_disk_read="always")


def stopped_after(model, folder, turns: list[list[int]], params=ONE) -> None:
    """An engine that ran `turns` on `folder`, then stopped (its writes on disk)."""
    eng = load(model, folder)
    for t in turns:
        eng.generate([t], params)
    eng.disk_tier.flush()


@pytest.fixture(scope="module", params=["llama", "qwen3_next"])
def model(request, model_dir):
    return model_dir(request.param)


def test_a_restart_resumes_at_the_previous_turns_end(model, tmp_path):
    conv = conversation(700)
    stopped_after(model, tmp_path, [conv[:150], conv[:400], conv[:600]])  # none ends on a block end
    eng = load(model, tmp_path)  # the restart: empty tree, same folder
    [r] = eng.generate([conv], GREEDY)
    assert eng.disk_tier.block == B == 256
    assert r.cached_tokens == 600  # 2 blocks and the tail past them; without tails it would be 512
    assert r.token_ids == reference_greedy(eng.model, conv, 6)
    s = eng.cache_stats()
    assert s["disk_loaded_blocks"] == 2 and s["disk_loaded_tails"] == 1 and s["memory_hits"] == 0
    eng.prefix.check()


def test_a_conversation_shorter_than_one_block_comes_back(model, tmp_path):
    conv = conversation(200, seed=1)
    stopped_after(model, tmp_path, [conv[:120]])
    eng = load(model, tmp_path)
    [r] = eng.generate([conv], GREEDY)
    assert r.cached_tokens == 120 and r.token_ids == reference_greedy(eng.model, conv, 6)


def test_the_next_turn_after_an_answer_reuses_the_answer_too(model_dir, tmp_path):
    """Dense: the tail of prompt + answer replaces the prompt's; a next turn that carries the
    answer resumes after it, one that dropped it (a replay) after the prompt."""
    m = model_dir("llama")
    conv = conversation(400, seed=2)
    first = load(m, tmp_path)
    answer = first.generate([conv[:300]], GREEDY)[0].token_ids
    first.disk_tier.flush()
    kv = 256 + len(decode_block(next(tmp_path.rglob(f"*{TAIL}*")).read_bytes())[1])
    assert 300 < kv <= 306
    with_answer = conv[:300] + answer + conv[300:]
    eng = load(m, tmp_path)
    [r] = eng.generate([with_answer], GREEDY)
    assert r.cached_tokens == kv and r.token_ids == reference_greedy(eng.model, with_answer, 6)
    eng = load(m, tmp_path)
    [r] = eng.generate([conv], GREEDY)
    assert r.cached_tokens == 300 and r.token_ids == reference_greedy(eng.model, conv, 6)


def test_a_prompt_that_parts_inside_the_tail_uses_the_common_part(model_dir, tmp_path):
    """Dense: the previous prompt's last tokens re-tokenized differently in the next one."""
    m = model_dir("llama")
    conv = conversation(500, seed=3)
    stopped_after(m, tmp_path, [conv[:400]])
    nxt = conv[:390] + [7, 7, 7] + conv[393:]
    eng = load(m, tmp_path)
    [r] = eng.generate([nxt], GREEDY)
    assert r.cached_tokens == 390 and r.token_ids == reference_greedy(eng.model, nxt, 6)


@pytest.mark.parametrize("how", ["flip", "truncate", "moved"])
def test_a_bad_tail_is_skipped_and_the_blocks_still_hit(model, tmp_path, caplog, how):
    conv, other = conversation(700, seed=4), conversation(600, seed=8)
    stopped_after(model, tmp_path, [conv[:600], other])
    eng = load(model, tmp_path)
    tail = eng.disk_tier.store.path(eng.disk_tier.hashes(np.asarray(conv, np.int32), 2)[1] + TAIL)
    raw = bytearray(tail.read_bytes())
    if how == "flip":
        raw[-3] ^= 0x10
        tail.write_bytes(bytes(raw))
    elif how == "truncate":
        tail.write_bytes(bytes(raw[:len(raw) // 3]))
    else:  # the other conversation's good tail under this one's name: its metadata says whose it is
        theirs = eng.disk_tier.store.path(eng.disk_tier.hashes(np.asarray(other, np.int32), 2)[1] + TAIL)
        tail.write_bytes(theirs.read_bytes())
    eng = load(model, tmp_path)
    with caplog.at_level(logging.WARNING, logger="graphc.kvdisk"):
        [r] = eng.generate([conv], GREEDY)
    assert any("skipping" in rec.message and TAIL in rec.message for rec in caplog.records)
    assert eng.cache_stats()["disk_rejected_files"] == 1 and eng.cache_stats()["disk_loaded_tails"] == 0
    # the full blocks still hit (a hybrid model resumes at the state of the last block end, 512)
    assert r.cached_tokens == 512 and r.token_ids == reference_greedy(eng.model, conv, 6)
    eng.disk_tier.flush()
    for f in tmp_path.rglob(f"*{TAIL}*"):
        decode_block(f.read_bytes())  # the bad one was removed; what is there now checks out


def test_two_conversations_on_one_chain_both_stay_correct(model_dir, tmp_path):
    """Two turns that end in the same block after the same blocks share one tail file: the later
    one replaces it; the other falls back to the blocks, never to the wrong tail."""
    m = model_dir("llama")
    shared = conversation(300, seed=5)
    a, b = shared + conversation(40, seed=6), shared + conversation(60, seed=7)
    stopped_after(m, tmp_path, [a, b])
    eng = load(m, tmp_path)
    rb = eng.generate([b + [9, 9]], GREEDY)[0]
    assert rb.cached_tokens == len(b) and rb.token_ids == reference_greedy(eng.model, b + [9, 9], 6)
    eng = load(m, tmp_path)
    ra = eng.generate([a + [9, 9]], GREEDY)[0]
    assert ra.cached_tokens == 300  # the part of b's tail a shares: up to where they part
    assert ra.token_ids == reference_greedy(eng.model, a + [9, 9], 6)
