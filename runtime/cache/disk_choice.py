"""The disk tier's choice on a hit: read the prefix's blocks from disk, or compute those tokens again.

Reading is not always the faster way back. A hit of N tokens held in B bytes of block files
costs about B / (the folder's read rate) to promote, and recomputing it about N / (the
engine's prefill rate). On a fast GPU with an ordinary disk reading loses: an 8B Llama shape
keeps 128 KiB of bf16 KV per token, so a 32k-token conversation is 3.75 GiB on disk, which
read back at ~1.05 GiB/s (read ahead on a few threads) takes ~3.6 s, where the H200 computes
the whole prompt cold in 1.56 s. On a CPU or Apple silicon (slow prefill, fast SSD) reading
wins by far. So the choice is measured, per hit (`kv_cache_disk_read`):

- `auto` (default): read when B / read rate < the time to prefill those N tokens after the
  M already matched in memory (runtime/prefill_rate.py `seconds_for(N, M)`: a per-token and
  a per-attention-pair cost fitted on this machine's forwards, so a long hit is not priced
  at the rate of short chunks at long offsets), both estimates on this machine; while
  either is unknown, read (and so measure). While reading a dense model's blocks, once
  `probe_bytes` of this hit are in, the rate this hit is getting is checked against
  recomputing what is left, and the read stops there when recomputing is faster (a
  folder slower than its estimate: files no longer in the page cache). A hybrid model's hit
  is read whole once begun: it can only resume at the recurrent state at its last block end.
- `always`: read, as the disk tier did before this choice existed.
- `never`: never read; the disk tier still writes, so a later `auto` / `always` server has it.

A hit not read is a miss for that part: its blocks stay on disk untouched and the prompt
computes them, with the same greedy output (a restored block is bit-identical to a computed
one either way).

The read rate is this tier's own measurement: bytes of block files over the wall time of the
promotions that read them (reading, checking and writing into the pool), a decayed ratio as
the prefill meter's (runtime/prefill_rate.py), which the engine hands in and the runner
feeds. Both estimates are kept in the folder (`rates.json` beside the blocks, written now and
then), so a restarted server, whose first request is often exactly such a hit, decides with
the last process's numbers instead of reading blindly; a folder moved to another machine
starts from its old numbers and the measurements replace them within a few hits / forwards.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("graphc.kvdisk")

MODES = ("auto", "always", "never")
DECAY = 0.9  # weight of the past at each new read observation
PROBE_BYTES = 64 << 20  # of one hit read before the rate it gets may stop it (smaller reads are noise)
RATES_FILE = "rates.json"
SAVE_EVERY_S = 10.0  # at most this often the estimates are written to the folder
SEED_BYTES = float(256 << 20)  # the weight of a persisted read rate, as if one read of this size


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"kv_cache_disk_read must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


class DiskReadChoice:
    """Whether a hit's blocks are read; the read-rate estimate; the counts of both outcomes."""

    def __init__(self, mode: str = "auto", prefill=None, folder: Path | None = None, clock=time.perf_counter):
        self.mode = check_mode(mode)
        self.prefill = prefill  # a PrefillRate (runtime/prefill_rate.py) or None: no prefill estimate
        self.clock = clock
        self.probe_bytes = PROBE_BYTES
        self.bytes = 0.0  # decayed sums of the reads measured
        self.seconds = 0.0
        self.counters = {"disk_read_choices": 0, "disk_recompute_choices": 0, "disk_recomputed_tokens": 0,
                         "disk_stopped_reads": 0}
        self.path = None if folder is None else Path(folder) / RATES_FILE
        self.saved_at: float | None = None
        self.load()

    # -- estimates --------------------------------------------------------------------------
    def read_rate(self) -> float | None:
        """Bytes per second of block reads, or None before any was measured or seeded."""
        return self.bytes / self.seconds if self.seconds > 0 else None

    def prefill_rate(self) -> float | None:
        return None if self.prefill is None else self.prefill.tokens_per_s()

    def compute_seconds(self, tokens: int, offset: int) -> float | None:
        """Seconds to prefill `tokens` positions after `offset` (None: no prefill estimate)."""
        return None if self.prefill is None else self.prefill.seconds_for(tokens, offset)

    def seed_read_rate(self, bytes_per_s: float, weight_bytes: float = SEED_BYTES) -> None:
        """Start from `bytes_per_s` (replaces what was measured): a persisted rate, or a test's."""
        if bytes_per_s <= 0:
            raise ValueError(f"a read rate must be > 0 bytes/s, got {bytes_per_s!r}")
        self.bytes, self.seconds = weight_bytes, weight_bytes / bytes_per_s

    def observe_read(self, nbytes: int, seconds: float) -> None:
        """A promotion read `nbytes` of block files in `seconds` (read, checked, into the pool)."""
        if nbytes <= 0 or seconds <= 0:
            return
        self.bytes = DECAY * self.bytes + nbytes
        self.seconds = DECAY * self.seconds + seconds

    # -- the choice ---------------------------------------------------------------------------
    def decide(self, tokens: int, nbytes: int, offset: int = 0) -> bool:
        """Read a hit of `tokens` tokens in `nbytes` of files, after `offset` tokens matched in
        memory (True), or compute them (False)."""
        rr, compute_s = self.read_rate(), self.compute_seconds(tokens, offset)
        if self.mode == "never":
            read, why = False, "kv_cache_disk_read=never"
        elif self.mode == "always":
            read, why = True, "kv_cache_disk_read=always"
        elif rr is None or compute_s is None:
            read, why = True, f"no estimate yet of the {'read' if rr is None else 'prefill'} rate"
        else:
            read_s = nbytes / rr
            read = read_s < compute_s
            why = (f"read {read_s * 1e3:.1f} ms at {rr / (1 << 30):.2f} GiB/s vs compute {compute_s * 1e3:.1f} ms "
                   f"({tokens / compute_s:.0f} tok/s at this length)")
        log.debug("kv disk tier: %s a hit of %d tokens (%.1f MiB on disk): %s",
                  "reading" if read else "recomputing", tokens, nbytes / (1 << 20), why)
        self.counters["disk_read_choices" if read else "disk_recompute_choices"] += 1
        if not read:
            self.counters["disk_recomputed_tokens"] += tokens
        return read

    def keep_reading(self, done_bytes: int, elapsed: float, left_bytes: int, left_tokens: int,
                     in_flight_bytes: int = 0, left_offset: int = 0) -> bool:
        """Mid-read (auto only): whether reading the rest, at the rate this hit gets so far, still
        beats computing it. `in_flight_bytes`: of `left_bytes`, the files being read ahead now,
        counted half done (else the first blocks, which shared the disk with them, make the
        rate look several times lower than it is); `left_offset`: where the tokens left start.
        Counts a stop."""
        if self.mode != "auto" or done_bytes < self.probe_bytes or elapsed <= 0 or left_tokens <= 0:
            return True
        compute_s = self.compute_seconds(left_tokens, left_offset)
        if compute_s is None:
            return True
        rate = (done_bytes + in_flight_bytes / 2) / elapsed
        left_bytes -= in_flight_bytes / 2
        if left_bytes / rate < compute_s:
            return True
        log.debug("kv disk tier: stopping a read after %.1f MiB at %.2f GiB/s: computing the %d tokens left "
                  "(%.1f ms) beats reading them (%.1f ms)", done_bytes / (1 << 20), rate / (1 << 30),
                  left_tokens, compute_s * 1e3, left_bytes / rate * 1e3)
        self.counters["disk_stopped_reads"] += 1
        self.counters["disk_recomputed_tokens"] += left_tokens
        return False

    # -- kept in the folder ---------------------------------------------------------------------
    def load(self) -> None:
        """The estimates the folder's last writer kept: the read rate, and the prefill rate for a
        meter that has measured nothing yet."""
        if self.path is None:
            return
        try:
            got = json.loads(self.path.read_text())
            rr, pr = got.get("read_bytes_per_s"), got.get("prefill_tokens_per_s")
            a, c = got.get("prefill_seconds_per_token"), got.get("prefill_seconds_per_pair")
        except (OSError, ValueError, AttributeError):
            return  # none yet, or unreadable: start unmeasured
        if _positive(rr):
            self.seed_read_rate(float(rr))
        if self.prefill is not None and self.prefill.tokens_per_s() is None and _positive(pr):
            self.prefill.seed(float(pr))
            if _positive(a) and isinstance(c, (int, float)) and c >= 0:
                self.prefill.seed_fit(float(a), float(c))

    def save(self, force: bool = False) -> None:
        """Write the estimates to the folder (at most every SAVE_EVERY_S unless `force`); a failed
        write is logged and skipped (the estimates are a hint, never needed)."""
        if self.path is None:
            return
        now = time.monotonic()
        if not force and self.saved_at is not None and now - self.saved_at < SAVE_EVERY_S:
            return
        rr, pr = self.read_rate(), self.prefill_rate()
        if rr is None and pr is None:
            return
        self.saved_at = now
        fit = None if self.prefill is None else self.prefill.fit()
        kept = {"read_bytes_per_s": rr, "prefill_tokens_per_s": pr,
                "prefill_seconds_per_token": fit and fit[0], "prefill_seconds_per_pair": fit and fit[1]}
        tmp = self.path.with_name(f".tmp-{RATES_FILE}-{os.getpid()}-{time.monotonic_ns()}")
        try:
            tmp.write_text(json.dumps(kept))
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("kv disk tier: could not keep the rate estimates in %s: %s", self.path, e)
            tmp.unlink(missing_ok=True)

    # -- views ----------------------------------------------------------------------------------
    def describe(self) -> dict:
        prefill = {"prefill_tokens_per_s": None} if self.prefill is None else self.prefill.describe()
        return {"read": self.mode, "read_bytes_per_s": self.read_rate(), **prefill}

    def stats(self) -> dict:
        rr, pr = self.read_rate(), self.prefill_rate()
        return {"disk_read_policy": self.mode, "disk_read_bytes_per_s": rr or 0.0,
                "disk_prefill_tokens_per_s": pr or 0.0, **self.counters}


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and x > 0
