"""The prefix cache's disk tier (runtime/cache/disk_tier.py, disk_files.py): KV blocks spilled to
a folder, read back by a new engine (a restart), exact; bad files are skipped, never served.

Blocks of 16 tokens keep the tiny model's prompts short. A "restart" is a second Engine on
the same folder: it starts with an empty pool and tree, so any hit it gets is from disk.
"""

from __future__ import annotations

import logging
import os

import mlx.core as mx
import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache.disk_files import SUFFIX, BadBlock, BlockStore, decode_block, encode_block
from graphc.runtime.cache.disk_tails import TAIL

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
B = 16


@pytest.fixture(scope="module")
def dense_dir(model_dir):
    return model_dir("llama")


def prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 1000, n).tolist()


def engine(model, folder, **kw) -> Engine:
    return Engine.load(model, prefill_chunk=32, kv_cache_dir=str(folder), kv_cache_block_tokens=B,
                       **{"kv_cache_disk_read": "always", **kw})


def written(eng: Engine) -> list:
    """The full-block files (tails: `tails`)."""
    eng.disk_tier.flush()
    return sorted(f for f in eng.disk_tier.store.dir.glob("*" + SUFFIX) if TAIL not in f.name)


def tails(eng: Engine) -> list:
    eng.disk_tier.flush()
    return sorted(eng.disk_tier.store.dir.glob(f"*{TAIL}{SUFFIX}"))


@pytest.fixture(scope="module")
def cold(dense_dir):
    """Greedy tokens of the test prompts with no prefix cache at all."""
    eng = Engine.load(dense_dir, prefill_chunk=32, graph="dense_noprefix")
    return lambda p: eng.generate([p], GREEDY)[0].token_ids


def test_restart_hits_disk_and_equals_cold(dense_dir, tmp_path, cold):
    p = prompt(70)
    first = engine(dense_dir, tmp_path)
    assert first.generate([p], GREEDY)[0].cached_tokens == 0
    files = written(first)
    assert len(files) == (70 + 8 - 1) // B  # the finished sequence's full blocks (its KV: prompt + 7 outputs)
    [tail] = tails(first)  # the positions past them: the prompt's tail, replaced by the sequence's
    kv = len(files) * B + len(decode_block(tail.read_bytes())[1])
    assert len(files) * B < kv <= 70 + 8
    second = engine(dense_dir, tmp_path)  # the restart: empty tree, same folder
    follow = p + first.generate([p], GREEDY)[0].token_ids + prompt(20, seed=1)  # the next turn
    r = second.generate([follow], GREEDY)[0]
    assert r.cached_tokens == kv  # all the stopped engine computed, not just its full blocks
    assert r.token_ids == cold(follow)
    s = second.cache_stats()
    assert s["disk_hits"] == 1 and s["memory_hits"] == 0 and s["disk_hit_tokens"] == kv
    assert s["disk_loaded_blocks"] == len(files) and s["disk_loaded_tails"] == 1
    # the same prompt again is a memory hit now
    assert second.generate([follow], GREEDY)[0].token_ids == r.token_ids
    s = second.cache_stats()
    assert s["memory_hits"] == 1 and s["disk_hits"] == 1
    second.prefix.check()


def test_a_one_token_request_leaves_its_prompt_on_disk(dense_dir, tmp_path, cold):
    p = prompt(64, seed=12)
    engine(dense_dir, tmp_path).generate([p], SamplingParams(max_tokens=1))  # ends at prefill: no decode row
    r = engine(dense_dir, tmp_path).generate([p + [4, 4]], GREEDY)[0]
    assert r.cached_tokens == 64 and r.token_ids == cold(p + [4, 4])


def test_evicted_blocks_spill_and_come_back(dense_dir, tmp_path, cold):
    eng = engine(dense_dir, tmp_path, max_total_tokens=100)
    eng.runner.prefix_io.disk = None  # no writes at prompt end / finish: only the eviction hook writes
    a, b = prompt(64, seed=2), prompt(64, seed=3)
    eng.generate([a], SamplingParams(max_tokens=0))
    assert written(eng) == []
    eng.generate([b], GREEDY)  # b does not fit beside a: a is evicted and spills
    assert eng.cache_stats()["evicted_tokens"] > 0
    assert len(written(eng)) == 4  # a's four blocks
    r = eng.generate([a + [5, 6, 7]], GREEDY)[0]
    assert r.cached_tokens == 64 and eng.cache_stats()["disk_hits"] == 1
    assert r.token_ids == cold(a + [5, 6, 7])
    eng.prefix.check()


def _spoil(files, how: str) -> None:
    f = files[-1]
    data = bytearray(f.read_bytes())
    if how == "flip":
        data[-5] ^= 0x40
        f.write_bytes(bytes(data))
    elif how == "truncate":
        f.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "empty":
        f.write_bytes(b"")
    elif how == "header":
        data[12] ^= 0x01
        f.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "truncate", "empty", "header"])
def test_a_spoiled_block_is_skipped_with_a_log_line(dense_dir, tmp_path, cold, caplog, how):
    p = prompt(70, seed=4)
    first = engine(dense_dir, tmp_path)
    first.generate([p], GREEDY)
    files = written(first)
    _spoil(files, how)
    second = engine(dense_dir, tmp_path)
    with caplog.at_level(logging.WARNING, logger="graphc.kvdisk"):
        r = second.generate([p + [9, 9]], GREEDY)[0]
    assert r.token_ids == cold(p + [9, 9])
    assert any("skipping" in rec.message for rec in caplog.records)
    s = second.cache_stats()
    assert s["disk_rejected_files"] == 1
    assert r.cached_tokens < len(files) * B  # not served past the bad block
    # The bad file was removed, and the finished request wrote a good copy back under its name.
    decode_block(files[-1].read_bytes())


def test_blocks_past_a_spoiled_one_are_not_used(dense_dir, tmp_path, cold):
    p = prompt(70, seed=5)
    first = engine(dense_dir, tmp_path)
    first.generate([p], GREEDY)
    files = written(first)
    by_start = sorted(files, key=lambda f: int(decode_block(f.read_bytes())[0]["start"]))
    by_start[1].write_bytes(b"\0" * 100)  # block 1 of 4
    second = engine(dense_dir, tmp_path)
    r = second.generate([p + [9]], GREEDY)[0]
    assert r.cached_tokens == B  # block 0 only: the chain stops at the bad block
    assert r.token_ids == cold(p + [9])


def test_another_models_file_is_not_served(dense_dir, model_dir, tmp_path, cold, caplog):
    other = model_dir("llama", seed=7)  # same config, other weights
    p = prompt(70, seed=6)
    theirs = engine(other, tmp_path)
    theirs.generate([p], GREEDY)
    foreign = written(theirs)
    mine = engine(dense_dir, tmp_path)
    assert mine.disk_tier.model_id != theirs.disk_tier.model_id
    assert mine.disk_tier.store.dir != theirs.disk_tier.store.dir
    # Their files copied under my model's names: the metadata says whose they are.
    mine_hashes = mine.disk_tier.hashes(np.asarray(p, np.int32), len(foreign))
    for j, h in enumerate(mine_hashes):
        src = next(f for f in foreign if int(decode_block(f.read_bytes())[0]["start"]) == j * B)
        mine.disk_tier.store.path(h).write_bytes(src.read_bytes())
    with caplog.at_level(logging.WARNING, logger="graphc.kvdisk"):
        r = mine.generate([p + [1]], GREEDY)[0]
    assert r.cached_tokens == 0 and r.token_ids == cold(p + [1])
    assert any("another model" in rec.message for rec in caplog.records)


def test_files_being_written_are_invisible(dense_dir, tmp_path):
    eng = engine(dense_dir, tmp_path)
    p = prompt(40, seed=8)
    h = eng.disk_tier.hashes(np.asarray(p, np.int32), 1)[0]
    # A writer that died mid-write leaves its temp name; a reader looks up final names only.
    (eng.disk_tier.store.dir / f".tmp-{h}-1-2-3").write_bytes(b"partial")
    r = eng.generate([p], GREEDY)[0]
    assert r.cached_tokens == 0
    assert eng.cache_stats()["disk_rejected_files"] == 0
    assert eng.disk_tier.store.path(h) in written(eng)  # the real block, written beside it


def test_two_engines_share_one_folder(dense_dir, tmp_path, cold):
    a, b = engine(dense_dir, tmp_path), engine(dense_dir, tmp_path)
    p, q = prompt(70, seed=9), prompt(70, seed=10)
    # Both write the same blocks (same prompt) and their own ones, interleaved.
    a.generate([p], GREEDY)
    b.generate([p], GREEDY)
    b.generate([q], GREEDY)
    a.generate([q], GREEDY)
    files = written(a) and written(b)
    for f in files:
        decode_block(f.read_bytes())  # every file is whole and checks out
    assert not list(a.disk_tier.store.dir.glob(".tmp-*"))
    c = engine(dense_dir, tmp_path)
    for x in (p, q):
        r = c.generate([x + [3]], GREEDY)[0]
        assert r.cached_tokens == 70 and r.token_ids == cold(x + [3])  # 4 blocks + the prompt's part of a tail


def test_size_cap_removes_least_recently_used(dense_dir, tmp_path):
    eng = engine(dense_dir, tmp_path)
    eng.generate([prompt(40, seed=11)], GREEDY)
    one = written(eng)[0].stat().st_size  # every block file of this model has the same size
    tail = tails(eng)[0].stat().st_size  # the prompt's 8 tokens past its 2 blocks (its KV then fills a 3rd)
    cap = 3 * one + tail + tail // 2
    capped = engine(dense_dir, tmp_path / "capped", kv_cache_disk_gb=cap / (1 << 30))
    for s in range(4):
        capped.generate([prompt(40, seed=20 + s)], GREEDY)  # 48 tokens of KV each: three blocks, one tail
    left = written(capped) + tails(capped)
    last = prompt(40, seed=23) + capped.generate([prompt(40, seed=23)], GREEDY)[0].token_ids
    h = capped.disk_tier.hashes(np.asarray(last, np.int32), 3)
    newest = {capped.disk_tier.store.path(x) for x in h} | {capped.disk_tier.store.path(h[1] + TAIL)}
    assert set(left) == newest  # the most recently used files stay
    st = capped.cache_stats()
    assert st["disk_bytes"] <= cap and st["disk_files"] == 4
    assert st["disk_removed_files"] == st["disk_written_blocks"] - 4 == 12


def test_sliding_models_say_the_disk_tier_is_off(model_dir, tmp_path, caplog):
    for arch in ("gpt_oss",):  # hybrid (recurrent) models write state files: tests/test_hybrid_boundaries.py
        with caplog.at_level(logging.WARNING, logger="graphc.kvdisk"):
            eng = engine(model_dir(arch), tmp_path / arch)
        assert eng.disk_tier is None
        s = eng.cache_stats()
        assert s["disk_enabled"] is False and "does not write" in s["disk_off"]
        assert any("kv disk tier off" in r.message for r in caplog.records)
        assert eng.generate([prompt(40)], GREEDY)[0].token_ids
        assert not os.path.exists(tmp_path / arch) or not any((tmp_path / arch).rglob("*" + SUFFIX))


def test_decode_rejects_garbage():
    for buf in (b"", b"\x01", b"\xff" * 16, (8).to_bytes(8, "little") + b"{}      "):
        with pytest.raises(BadBlock):
            decode_block(buf)


def test_read_ahead_yields_each_block_in_order_and_skips_a_spoiled_one(tmp_path):
    """BlockStore.read_many (the read-ahead a long hit uses) gives what read() gives, block by block
    in order; a corrupt file in the middle is None at its place and removed, as read() does."""
    store = BlockStore(tmp_path, "m" * 40)
    names = [f"b{j}" for j in range(7)]
    for j, name in enumerate(names):
        plane = np.full((2, 4, 8), j, np.float32).tobytes()
        store.path(name).write_bytes(encode_block({"block": name}, np.arange(4) + 4 * j,
                                                  {"l0.0": (mx.float32, (2, 4, 8), plane)}))
    spoiled = store.path(names[4])
    buf = bytearray(spoiled.read_bytes())
    buf[-1] ^= 0xFF
    spoiled.write_bytes(bytes(buf))
    got = list(store.read_many(names))
    assert [g is None for g in got] == [False] * 4 + [True] + [False] * 2
    for j, g in enumerate(got):
        if g is not None:
            assert g[0]["block"] == names[j] and g[1].tolist() == list(range(4 * j, 4 * j + 4))
            assert float(g[2]["l0.0"].sum()) == j * 64
    assert not spoiled.exists()
    early = store.read_many(names)
    assert next(early)[0]["block"] == "b0"
    early.close()  # a caller that stops early drops the reads in flight
    store.close()


def _with_meta(buf: bytes, **meta) -> bytes:
    """A block file's bytes with its metadata entries replaced (the data section unchanged)."""
    import json
    import struct
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    header["__metadata__"].update(meta)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + buf[8 + n:]


def test_block_checksums_by_format():
    """New files carry a CRC-32 of their data (format 2, disk_files.FORMATS says why); a format-1
    file, blake2b, written before, still reads; a flipped data byte fails either, and an unknown
    format is never served."""
    import hashlib
    import zlib

    plane = np.arange(2 * 4 * 8, dtype=np.float32).reshape(2, 4, 8)
    buf = encode_block({"block": "b0"}, np.arange(4), {"l0.0": (mx.float32, plane.shape, plane.tobytes())})
    meta, tokens, arrays = decode_block(buf)
    data = buf[len(buf) - plane.nbytes - 16:]  # the data section: 4 int32 tokens, then the plane
    assert meta["format"] == "graphc-kv-block/2" and meta["checksum"] == f"{zlib.crc32(data):08x}"
    assert np.array_equal(np.array(arrays["l0.0"]), plane) and tokens.tolist() == [0, 1, 2, 3]
    old = _with_meta(buf, format="graphc-kv-block/1", checksum=hashlib.blake2b(data, digest_size=20).hexdigest())
    assert np.array_equal(np.array(decode_block(old)[2]["l0.0"]), plane)
    for good in (buf, old):
        bad = bytearray(good)
        bad[-3] ^= 0x10
        with pytest.raises(BadBlock, match="checksum"):
            decode_block(bytes(bad))
    with pytest.raises(BadBlock, match="format 'graphc-kv-block/9'"):
        decode_block(_with_meta(buf, format="graphc-kv-block/9"))
