"""The disk tier's read-or-recompute choice (runtime/cache/disk_choice.py, `kv_cache_disk_read`):
`never` computes a restarted hit and reads nothing, `always` reads it, `auto` reads when the
read-rate estimate beats the prefill-rate estimate (handed in here, so no test depends on how
fast this machine is), and the estimates come from real reads and prefill forwards. Greedy
output is the cold run's whichever way the hit comes back.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cache.disk_choice import RATES_FILE, DiskReadChoice
from graphc.runtime.cache.disk_files import SUFFIX
from graphc.runtime.prefill_rate import PrefillRate, attention_pairs

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
B = 16


def prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 1000, n).tolist()


def engine(model, folder, **kw) -> Engine:
    return Engine.load(model, prefill_chunk=32, kv_cache_dir=str(folder), kv_cache_block_tokens=B, **kw)


@pytest.fixture(scope="module")
def dense_dir(model_dir):
    return model_dir("llama")


@pytest.fixture(scope="module")
def cold(dense_dir):
    eng = Engine.load(dense_dir, prefill_chunk=32, graph="dense_noprefix")
    return lambda p: eng.generate([p], GREEDY)[0].token_ids


@pytest.fixture
def written(dense_dir, tmp_path):
    """A folder a stopped engine left a 70-token conversation turn in (4 blocks and a tail), and
    the next turn's prompt."""
    first = engine(dense_dir, tmp_path, kv_cache_disk_read="always")
    p = prompt(70)
    out = first.generate([p], GREEDY)[0].token_ids
    first.disk_tier.flush()
    files = sorted(first.disk_tier.store.dir.glob("*" + SUFFIX))
    assert len(files) == 5
    return tmp_path, p + out + prompt(20, seed=1), files


def snapshot(files) -> list:
    return [(f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files]


def test_never_recomputes_and_reads_nothing(dense_dir, written, cold):
    folder, follow, files = written
    before = snapshot(files)
    eng = engine(dense_dir, folder, kv_cache_disk_read="never")
    r = eng.generate([follow], GREEDY)[0]
    assert r.cached_tokens == 0 and r.token_ids == cold(follow)
    s = eng.cache_stats()
    assert s["disk_loaded_blocks"] == 0 and s["disk_loaded_tails"] == 0 and s["disk_hits"] == 0
    assert s["disk_recompute_choices"] == 1 and s["disk_read_choices"] == 0 and s["disk_recomputed_tokens"] > 64
    eng.disk_tier.flush()
    assert snapshot(files) == before  # untouched: not read (a read touches mtime), not rewritten, not removed
    eng.prefix.check()


def test_always_reads_whatever_the_estimates_say(dense_dir, written, cold):
    folder, follow, _ = written
    eng = engine(dense_dir, folder, kv_cache_disk_read="always")
    eng.disk_tier.choice.seed_read_rate(1.0)  # a byte a second: auto would compute
    eng.prefill_rate.seed(1e9)
    r = eng.generate([follow], GREEDY)[0]
    assert r.cached_tokens > 64 and r.token_ids == cold(follow)
    assert eng.cache_stats()["disk_loaded_blocks"] == 4 and eng.cache_stats()["disk_read_choices"] == 1


@pytest.mark.parametrize("read_rate, prefill_rate, reads", [
    (1e3, 1e9, False),  # a slow disk and a fast prefill: computing wins
    (1e15, 1.0, True),  # a fast disk and a slow prefill: reading wins
])
def test_auto_follows_the_estimates(dense_dir, written, cold, read_rate, prefill_rate, reads, caplog):
    folder, follow, _ = written
    eng = engine(dense_dir, folder)  # auto is the default
    assert eng.disk_tier.choice.mode == "auto"
    eng.disk_tier.choice.seed_read_rate(read_rate)
    eng.prefill_rate.seed(prefill_rate)
    with caplog.at_level(logging.DEBUG, logger="graphc.kvdisk"):
        r = eng.generate([follow], GREEDY)[0]
    assert r.token_ids == cold(follow)
    s = eng.cache_stats()
    assert (r.cached_tokens > 64) is reads
    assert (s["disk_loaded_blocks"] == 4) is reads and s["disk_read_choices"] == int(reads)
    assert s["disk_recompute_choices"] == int(not reads)
    said = [m for m in caplog.messages if "a hit of" in m]
    assert len(said) == 1 and said[0].startswith("kv disk tier: " + ("reading" if reads else "recomputing"))
    eng.prefix.check()


def test_estimates_come_from_real_reads_and_forwards_and_survive_a_restart(dense_dir, written, cold):
    folder, follow, _ = written
    eng = engine(dense_dir, folder)
    assert eng.disk_tier.choice.read_rate() is None  # the writer never read: nothing to go by, so it reads
    assert eng.prefill_rate.tokens_per_s() is not None  # the writer's prefill rate, kept in the folder
    r = eng.generate([follow], GREEDY)[0]
    assert r.cached_tokens > 64 and r.token_ids == cold(follow)
    assert eng.disk_tier.choice.read_rate() > 0 and eng.prefill_rate.observed >= 1
    assert eng.describe()["disk_tier"]["read_bytes_per_s"] == eng.disk_tier.choice.read_rate()
    eng.disk_tier.flush()
    kept = json.loads((eng.disk_tier.store.dir / RATES_FILE).read_text())
    assert kept["read_bytes_per_s"] > 0 and kept["prefill_tokens_per_s"] > 0
    again = engine(dense_dir, folder)  # a restart decides with the numbers the last process kept
    assert again.disk_tier.choice.read_rate() == pytest.approx(kept["read_bytes_per_s"])
    assert again.prefill_rate.tokens_per_s() == pytest.approx(kept["prefill_tokens_per_s"])
    again.disk_tier.flush()  # the folder's scan is done
    blocks = list(again.disk_tier.store.dir.glob("*" + SUFFIX))
    assert again.disk_tier.store.stats()["disk_files"] == len(blocks) >= 5  # rates.json is no block file


def test_the_warm_up_is_not_a_prefill_measurement(dense_dir, tmp_path):
    eng = engine(dense_dir, tmp_path)
    eng.warm_up(shapes=False, agent=True)
    assert eng.prefill_rate.observed == 0 and eng.prefill_rate.tokens_per_s() is None
    assert eng.disk_tier.choice.read_rate() is None  # its read was of a scratch folder
    eng.generate([prompt(40)], GREEDY)
    assert eng.prefill_rate.observed >= 1


def test_the_runner_tells_the_meter_each_chunk_s_offset(dense_dir, tmp_path, monkeypatch):
    eng = engine(dense_dir, tmp_path)
    seen = []
    monkeypatch.setattr(eng.prefill_rate, "observe", lambda n, t, pairs=None: seen.append((n, pairs)))
    eng.generate([prompt(80)], GREEDY)  # chunks of 32: 32 at 0, 32 at 32, 16 at 64
    assert [n for n, _ in seen] == [32, 32, 16]
    assert [p for _, p in seen] == [attention_pairs(32, 0), attention_pairs(32, 32), attention_pairs(16, 64)]


class Clock:
    """Each call one second later: every block read looks slow, deterministically."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_auto_stops_a_read_that_turns_out_slower_than_computing(dense_dir, written, cold):
    folder, follow, _ = written
    eng = engine(dense_dir, folder)
    choice = eng.disk_tier.choice
    assert choice.read_rate() is None  # so it starts reading
    eng.prefill_rate.seed(1e9)
    choice.clock, choice.probe_bytes = Clock(), 1  # checked after the first block, which took "a second"
    r = eng.generate([follow], GREEDY)[0]
    assert r.cached_tokens == B and r.token_ids == cold(follow)  # one block read, the rest computed
    s = eng.cache_stats()
    assert s["disk_stopped_reads"] == 1 and s["disk_loaded_blocks"] == 1 and s["disk_loaded_tails"] == 0
    assert s["disk_recomputed_tokens"] > 3 * B
    eng.prefix.check()


def test_the_choice_alone():
    meter = PrefillRate()
    c = DiskReadChoice("auto", meter)
    assert c.decide(1000, 1 << 30)  # no estimates: read
    meter.observe(1000, 0.5)  # 2000 tok/s: 1000 tokens in 0.5 s
    assert c.decide(1000, 1 << 30)  # still no read rate
    c.observe_read(1 << 30, 1.0)  # 1 GiB/s
    assert not c.decide(1000, 1 << 30)  # 1 s to read against 0.5 s to compute
    assert c.decide(4000, 1 << 30)  # 1 s against 2 s
    assert DiskReadChoice("always", meter).decide(1, 1 << 40)
    assert not DiskReadChoice("never").decide(10 ** 6, 1)
    with pytest.raises(ValueError, match="kv_cache_disk_read"):
        DiskReadChoice("sometimes")
    with meter.paused():
        meter.observe(10, 100.0)
    assert meter.tokens_per_s() == pytest.approx(2000)


def _meter_on(a: float, c: float, chunks) -> PrefillRate:
    """A meter fed forwards that cost exactly a * tokens + c * attention pairs."""
    meter = PrefillRate()
    for n, offset in chunks:
        meter.observe(n, a * n + c * attention_pairs(n, offset), attention_pairs(n, offset))
    return meter


def test_the_prefill_fit_prices_a_long_recompute_by_its_own_length():
    # costs of the H200 8B shape's order: a cold 30k prompt ~1.3 s, a 2k turn over 28k of context ~0.15 s
    a, c = 5e-6, 2.5e-9
    chunks = [(2048, o) for o in range(0, 8192, 2048)] + [(2048, o) for o in range(16384, 30720, 2048)]
    meter = _meter_on(a, c, chunks)  # a few cold prompts' chunks, then conversation turns at long offsets
    fa, fc = meter.fit()
    assert fa == pytest.approx(a, rel=1e-6) and fc == pytest.approx(c, rel=1e-6)
    true = a * 30720 + c * attention_pairs(30720)
    assert meter.seconds_for(30720) == pytest.approx(true, rel=1e-6)
    flat = 30720 / meter.tokens_per_s()  # the flat rate of those recent long-offset chunks
    assert flat > 1.2 * true
    # a 32k hit of 3.75 GiB whose read takes between the two estimates: the fit recomputes it, the
    # flat rate alone would have read it
    hit = int(3.75 * (1 << 30))
    read_s = (true + flat) / 2
    by_fit = DiskReadChoice("auto", meter)
    by_fit.observe_read(hit, read_s)
    assert not by_fit.decide(30720, hit)
    flat_only = PrefillRate()
    flat_only.seed(meter.tokens_per_s())
    by_flat = DiskReadChoice("auto", flat_only)
    by_flat.observe_read(hit, read_s)
    assert by_flat.decide(30720, hit)
    # what is left of a read is priced at its own offset: the last 1k tokens of a 31k prompt are dear
    assert meter.seconds_for(1024, 29696) > 3 * meter.seconds_for(1024, 0)
    assert by_fit.compute_seconds(1024, 29696) == pytest.approx(meter.seconds_for(1024, 29696))


def test_the_prefill_fit_falls_back_to_the_flat_rate_while_unsound():
    same = _meter_on(2e-5, 4e-10, [(2048, 4096)] * 6)  # one size, one offset: a and c not told apart
    assert same.fit() is None
    assert same.seconds_for(2048, 4096) == pytest.approx(2048 / same.tokens_per_s())
    few = _meter_on(2e-5, 4e-10, [(2048, 0), (2048, 8192)])  # too little weight yet
    assert few.fit() is None
    negative = PrefillRate()  # longer offsets measured *cheaper*: c < 0 is noise, not a model
    for n, o, t in [(1024, 0, 0.05), (1024, 8192, 0.03), (1024, 16384, 0.02), (1024, 24576, 0.01)]:
        negative.observe(n, t, attention_pairs(n, o))
    assert negative.fit() is None and negative.seconds_for(1024) == pytest.approx(1024 / negative.tokens_per_s())
    assert PrefillRate().seconds_for(10) is None
    seeded = _meter_on(2e-5, 4e-10, [(2048, o) for o in range(0, 16384, 2048)])
    seeded.seed(1000.0)  # a flat rate handed in replaces the fit too
    assert seeded.fit() is None and seeded.seconds_for(500, 9000) == pytest.approx(0.5)


def test_the_prefill_fit_is_kept_in_the_folder(tmp_path):
    meter = _meter_on(2e-5, 4e-10, [(2048, o) for o in range(0, 16384, 2048)])
    writer = DiskReadChoice("auto", meter, tmp_path)
    writer.observe_read(1 << 30, 2.0)
    writer.save(force=True)
    kept = json.loads((tmp_path / RATES_FILE).read_text())
    assert kept["prefill_seconds_per_token"] == pytest.approx(2e-5, rel=1e-6)
    fresh = PrefillRate()
    reader = DiskReadChoice("auto", fresh, tmp_path)
    assert fresh.fit() == pytest.approx(meter.fit(), rel=1e-9)
    assert reader.compute_seconds(30720, 0) == pytest.approx(meter.seconds_for(30720), rel=1e-9)
    assert reader.describe()["prefill_seconds_per_pair"] == pytest.approx(4e-10, rel=1e-6)
    (tmp_path / RATES_FILE).write_text(json.dumps({"prefill_tokens_per_s": 5000.0}))  # an older file: flat only
    old = PrefillRate()
    DiskReadChoice("auto", old, tmp_path)
    assert old.fit() is None and old.seconds_for(5000) == pytest.approx(1.0)
