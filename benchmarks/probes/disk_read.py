"""How fast the disk tier reads a long prompt's blocks back: one file after the other
(`BlockStore.read`) against the read-ahead threads (`BlockStore.read_many`, what
`DiskTier.promote` uses), from a cold page cache (each file is dropped from it before a pass),
on block files of a serving shape's KV (default: llama-3.1-8b, 32 layers x 8 KV heads x 128,
bf16: 32 MiB per 256-token block).

    python benchmarks/probes/disk_read.py --blocks 64 [--dir /tmp/graphc-disk-read] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import mlx.core as mx
import numpy as np

from graphc.runtime.cache.disk_files import READ_AHEAD, BlockStore, encode_block


def write_blocks(store: BlockStore, n: int, layers: int, heads: int, dim: int, tokens: int) -> list[str]:
    rng = np.random.default_rng(0)
    names = []
    plane = rng.integers(0, 2**16, size=(heads, tokens, dim), dtype=np.uint16).tobytes()  # bf16 bit patterns
    for j in range(n):
        arrays = {f"l{i}.{p}": (mx.bfloat16, (heads, tokens, dim), plane) for i in range(layers) for p in (0, 1)}
        toks = np.arange(j * tokens, (j + 1) * tokens, dtype=np.int32)
        name = f"probe{j:05d}"
        store.path(name).write_bytes(encode_block({"model": "probe", "block": name, "start": j * tokens}, toks, arrays))
        names.append(name)
    return names


def drop_cache(store: BlockStore, names: list[str]) -> None:
    for name in names:
        fd = os.open(store.path(name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(store: BlockStore, names: list[str], many: bool) -> float:
    drop_cache(store, names)
    t0 = time.perf_counter()
    reads = store.read_many(names) if many else (store.read(n) for n in names)
    for got in reads:
        assert got is not None
        mx.eval(list(got[2].values()))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="folder for the files (default: a temporary one)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="graphc-disk-read-", dir=a.dir) as root:
        store = BlockStore(root, "probe")
        names = write_blocks(store, a.blocks, a.layers, a.heads, a.dim, a.tokens)
        gib = sum(store.path(n).stat().st_size for n in names) / 2**30
        runs = {"one by one": [], "read ahead": []}
        for _ in range(a.repeats):
            runs["one by one"].append(timed(store, names, many=False))
            runs["read ahead"].append(timed(store, names, many=True))
        store.close()
    print(f"{a.blocks} blocks, {gib:.2f} GiB, {os.cpu_count()} CPUs, read-ahead {READ_AHEAD} threads")
    for k, ts in runs.items():
        med = statistics.median(ts)
        print(f"{k:11s}: {med:.2f} s median ({min(ts):.2f}-{max(ts):.2f}), {gib / med:.2f} GiB/s")


if __name__ == "__main__":
    main()
