"""The prefix cache's disk tier, file side: one checksummed safetensors file per KV block.

A block is `block_tokens` consecutive prompt positions of every pool-backed layer, named by
a chained hash of the model identity and *all* token ids up to the block's end (so a name
says both "this model" and "this exact prefix"). Files are write-once and content-addressed:
two servers writing the same block write the same bytes, and each writes to a private temp
name and renames it into place (atomic on POSIX), so a reader never sees half a file and
concurrent writers never corrupt one. A file is trusted only after its checksum, model
identity, name and token ids check out; anything else is skipped with a log line.

Layout: `DIR/<model id[:32]>/<block hash>.safetensors`. Each file is a plain safetensors
file (readable by any safetensors tool): tensors `tokens` (int32 [n]) and `l<layer>.<plane>`
(the pool's planes, [heads, n, ...], at the pool's dtype), and `__metadata__` with
`format`, `model`, `block`, `start`, `tokens_n` and `checksum` (CRC-32 of the data section; files of
format 1 carry a blake2b digest and are still read).
A hybrid model's recurrent state at a block end is a file of the same format named
`<block hash>-state`: `tokens` (that block's ids), `s<layer>.<k>` (the state arrays) and
`kind` "state" in its metadata (runtime/cache/disk_tier.py). The positions past a sequence's
last full block are a `<block hash>-tail` file (`kind` "tail", runtime/cache/disk_tails.py), the
one file that a later write replaces (renamed into place the same way).

Size cap: least recently used files first (mtime; a read touches the file), over the
whole folder, enforced by the writer thread after its writes.

Why CRC-32 for the data: the checksum guards against corruption and truncation (a file's name,
model and token ids are checked apart from it), and reading a hit back is the one place its cost
shows. blake2b hashed 0.75 GiB/s on a core of the development machine, CRC-32 3.8 GiB/s; the
disk probe (benchmarks/probes/disk_read.py, 2 GiB of 8B-shape blocks, cold page cache) read
0.36 GiB/s one file after the other and 0.62 GiB/s read ahead with blake2b, 0.58-0.68 and
0.93-1.10 GiB/s with CRC-32 (three runs). A random corruption passes a CRC-32 once in 2^32.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import numpy as np

log = logging.getLogger("graphc.kvdisk")

FORMAT = "graphc-kv-block/2"  # the data's checksum: CRC-32 (format 1: blake2b, still read)
FORMATS = {"graphc-kv-block/1": lambda data: hashlib.blake2b(data, digest_size=20).hexdigest(),
           FORMAT: lambda data: f"{zlib.crc32(data):08x}"}
SUFFIX = ".safetensors"
_DTYPES = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16", mx.int8: "I8", mx.uint8: "U8",
           mx.int32: "I32", mx.uint32: "U32", mx.int16: "I16", mx.uint16: "U16"}
_BY_NAME = {v: k for k, v in _DTYPES.items()}
READ_AHEAD = max(2, min(8, os.cpu_count() or 2))  # block files read and checked at once on a hit


class BadBlock(Exception):
    """A block file that must not be served (corrupt, truncated, foreign, or not what its name says)."""


def chain_hash(prev: str, tokens: np.ndarray) -> str:
    return hashlib.blake2b(prev.encode() + np.asarray(tokens, np.int32).tobytes(), digest_size=20).hexdigest()


def encode_block(meta: dict, tokens: np.ndarray, arrays: dict[str, tuple]) -> bytes:
    """The safetensors bytes of one block; `arrays`: name -> (mx dtype, shape, raw bytes) (raw bytes,
    not numpy arrays: bfloat16 has no numpy dtype, and no mx work happens on the writer thread)."""
    parts, header, off = [], {}, 0
    items = [("tokens", "I32", list(tokens.shape), np.asarray(tokens, np.int32).tobytes())]
    for name, (dtype, shape, raw) in arrays.items():
        items.append((name, _DTYPES[dtype], list(shape), raw))
    for name, dt, shape, raw in items:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        parts.append(raw)
        off += len(raw)
    data = b"".join(parts)
    header["__metadata__"] = {**{k: str(v) for k, v in meta.items()}, "format": FORMAT,
                              "checksum": FORMATS[FORMAT](data)}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + data


def parse_block(buf: bytes) -> tuple[dict, np.ndarray, dict[str, tuple]]:
    """(metadata, tokens, {name: (mx dtype, shape, raw uint8 numpy view)}) of a block file's bytes;
    BadBlock when they do not check out. No mx work: it runs on the read-ahead threads."""
    if len(buf) < 8:
        raise BadBlock(f"{len(buf)} bytes: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > len(buf) - 8:
        raise BadBlock(f"truncated: header of {n} bytes in a file of {len(buf)}")
    try:
        header = json.loads(buf[8:8 + n])
        meta = header.pop("__metadata__")
    except (ValueError, KeyError) as e:
        raise BadBlock(f"unreadable header ({e})") from None
    data = memoryview(buf)[8 + n:]
    digest = FORMATS.get(meta.get("format"))
    if digest is None:
        raise BadBlock(f"format {meta.get('format')!r}, expected one of {', '.join(map(repr, FORMATS))}")
    if digest(data) != meta.get("checksum"):
        raise BadBlock("checksum mismatch (corrupt or truncated data)")
    tokens, arrays = None, {}
    try:
        for name, t in header.items():
            lo, hi = t["data_offsets"]
            raw = np.frombuffer(data[lo:hi], np.uint8)
            if name == "tokens":
                tokens = raw.view(np.int32).copy()
                continue
            dt = _BY_NAME[t["dtype"]]
            shape = list(t["shape"])
            arrays[name] = (dt, shape, raw.reshape(shape[:-1] + [shape[-1] * dt.size]))
    except (KeyError, ValueError, TypeError) as e:
        raise BadBlock(f"bad tensor entry ({type(e).__name__}: {e})") from None
    if tokens is None:
        raise BadBlock("no tokens tensor")
    return meta, tokens, arrays


def as_mx(arrays: dict[str, tuple]) -> dict[str, mx.array]:
    return {name: mx.array(raw).view(dt) for name, (dt, _, raw) in arrays.items()}


def decode_block(buf: bytes) -> tuple[dict, np.ndarray, dict[str, mx.array]]:
    """(metadata, tokens, arrays) of a block file's bytes; BadBlock when they do not check out."""
    meta, tokens, arrays = parse_block(buf)
    return meta, tokens, as_mx(arrays)


class BlockStore:
    """The folder: reads (on the caller's thread) and a background writer that renames finished
    files into place and keeps the folder under its size cap."""

    def __init__(self, root: str | Path, model_id: str, cap_bytes: int | None = None):
        self.root = Path(root)
        self.dir = self.root / model_id[:32]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cap = cap_bytes
        self.counters = {"disk_written_blocks": 0, "disk_rejected_files": 0, "disk_removed_files": 0,
                         "disk_write_errors": 0}
        self.bytes_on_disk = 0
        self.files = 0
        self._queue: queue.Queue = queue.Queue()
        self._writes_since_scan = 0
        self._pool: ThreadPoolExecutor | None = None  # read-ahead threads, made on the first long hit
        # The folder may hold files of an earlier run (or other servers): indexed in the background
        # so a large folder does not delay the engine's start; lookups go by name and never wait.
        self._thread = threading.Thread(target=self._run, name="graphc-kvdisk", daemon=True)
        self._thread.start()
        self._queue.put(("scan", None, None))

    def path(self, block: str) -> Path:
        return self.dir / (block + SUFFIX)

    def exists(self, block: str) -> bool:
        return self.path(block).is_file()

    def size(self, block: str) -> int | None:
        """The file's size in bytes, or None when it is not there (a stat, nothing read)."""
        try:
            return self.path(block).stat().st_size
        except OSError:
            return None

    def sizes(self, blocks: list[str]) -> list[int]:
        """The sizes of the leading files of `blocks` that are there, up to the first missing one:
        what reading them would cost, before anything is read (runtime/cache/disk_choice.py)."""
        out = []
        for b in blocks:
            n = self.size(b)
            if n is None:
                break
            out.append(n)
        return out

    def read(self, block: str) -> tuple[dict, np.ndarray, dict] | None:
        """A block's contents if its file is there and checks out; a bad file is logged, removed
        (a later write puts a good one back) and never returned."""
        got = self._load(block)
        return None if got is None else (got[0], got[1], as_mx(got[2]))

    def read_many(self, blocks: list[str]):
        """read() of each block in order, as a generator, with the files read and checked ahead
        on a few threads: file reads and the checksum release the GIL, so a long prompt's blocks
        (32 MiB each at 8B) come in at the disk's speed instead of one read-then-hash at a time.
        Stop iterating at the first None; reads still in flight are dropped."""
        if len(blocks) <= 1:
            yield from (self.read(b) for b in blocks)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=READ_AHEAD, thread_name_prefix="graphc-kvread")
        ahead: deque = deque()
        todo = iter(blocks)
        try:
            for b in todo:
                ahead.append(self._pool.submit(self._load, b))
                if len(ahead) >= READ_AHEAD:
                    break
            while ahead:
                got = ahead.popleft().result()
                nxt = next(todo, None)
                if nxt is not None:
                    ahead.append(self._pool.submit(self._load, nxt))
                yield None if got is None else (got[0], got[1], as_mx(got[2]))
        finally:
            for f in ahead:
                f.cancel()

    def _load(self, block: str) -> tuple[dict, np.ndarray, dict] | None:
        p = self.path(block)
        try:
            buf = p.read_bytes()
        except FileNotFoundError:
            return None  # not there, or another server's cap removed it just now
        except OSError as e:
            log.warning("kv disk tier: skipping %s: %s", p, e)
            return None
        try:
            out = parse_block(buf)
        except BadBlock as e:
            self.reject(p, str(e))
            return None
        try:
            os.utime(p)  # least recently *used* goes first under the cap
        except OSError:
            pass
        return out

    def reject(self, p: Path, why: str) -> None:
        log.warning("kv disk tier: skipping %s: %s", p, why)
        self.counters["disk_rejected_files"] += 1
        try:
            p.unlink()
        except OSError:
            pass

    def put(self, block: str, payload, replace: bool = False) -> None:
        """Queue a block for writing: `payload()` returns its bytes (built on the writer thread).
        `replace`: write over an existing file of that name (tails, runtime/cache/disk_tails.py);
        blocks are write-once."""
        self._queue.put(("replace" if replace else "write", block, payload))

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued write is on disk (tests, shutdown)."""
        done = threading.Event()
        self._queue.put(("mark", done, None))
        done.wait(timeout)

    def close(self, timeout: float = 60.0) -> None:
        """Finish the queued writes and end the writer thread (a scratch store, runtime/warmup.py)."""
        self._queue.put(("stop", None, None))
        self._thread.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    # -- the writer thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            op, a, b = self._queue.get()
            if op == "stop":
                return
            try:
                if op in ("write", "replace"):
                    self._write(a, b, replace=op == "replace")
                elif op == "scan":
                    self._scan()
                elif op == "mark":
                    a.set()
            except Exception as e:  # noqa: BLE001 - a full disk or a permission must not stop the engine
                self.counters["disk_write_errors"] += 1
                log.warning("kv disk tier: %s failed: %s: %s", op, type(e).__name__, e)

    def _write(self, block: str, payload, replace: bool = False) -> None:
        final = self.path(block)
        if final.exists() and not replace:
            return  # write-once: another server (or an earlier run) has it
        data = payload()
        try:
            old = final.stat().st_size if replace else None
        except OSError:
            old = None
        tmp = self.dir / f".tmp-{block}-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                tmp.unlink()
        self.counters["disk_written_blocks"] += 1
        self.bytes_on_disk += len(data) - (old or 0)
        self.files += old is None
        self._writes_since_scan += 1
        if self.cap is not None and (self.bytes_on_disk > self.cap or self._writes_since_scan >= 64):
            self._scan()  # other servers write here too: recount before removing anything

    def _scan(self) -> None:
        entries = []
        for sub in self.root.iterdir() if self.root.is_dir() else ():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if f.name.endswith(SUFFIX):
                    try:
                        st = f.stat()
                    except OSError:
                        continue
                    entries.append((st.st_mtime, st.st_size, f))
        total, removed = sum(e[1] for e in entries), 0
        if self.cap is not None and total > self.cap:
            for _, size, f in sorted(entries, key=lambda e: e[0]):
                if total <= self.cap:
                    break
                try:
                    f.unlink()
                except OSError:
                    continue  # another server removed it first
                total -= size
                removed += 1
            self.counters["disk_removed_files"] += removed
        self.bytes_on_disk = total
        self.files = len(entries) - removed
        self._writes_since_scan = 0

    def stats(self) -> dict:
        return {"disk_bytes": self.bytes_on_disk, "disk_files": self.files, "disk_cap_bytes": self.cap or 0,
                **self.counters}
