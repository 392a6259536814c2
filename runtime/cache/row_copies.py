"""Copies of a batch's rows out of its [B, H, T, ...] planes (runtime/cache/full.py's filter and
extend_all): kept rows in a few runs are copied run by run, scattered ones gathered, on a GPU as
8-byte words; and the warm-up that builds these copies' kernels before a client's step does.
"""

from __future__ import annotations

import mlx.core as mx

MAX_COPY_RUNS = 8  # more runs of kept rows than this: one gather instead of a copy per run


def word_gather_here() -> bool:
    """Whether gather_rows copies rows as 8-byte words: on a GPU (where it was measured)."""
    return mx.default_device().type == mx.DeviceType.gpu


def gather_rows(x: mx.array, rows: list[int], first: int = 0) -> mx.array:
    """x[rows][..., first:, :] as a new contiguous [len(rows), H, T - first, ...] array.

    On a GPU each row is gathered as one flat vector of 8-byte words where its bytes allow: MLX's
    gather by row index of a [B, H, T, D] bf16 plane took 31-41 ms for 8.5 GiB of KV (64 rows,
    16 layers of Llama-3.2-1B at 4,352 columns) on an H100 against 6.9-9.0 ms as words
    (benchmarks/probes/row_filter.py, benchmarks/results/h100-row-filter.txt): a quarter of the
    elements, each row one contiguous run. Its dropped columns then cost one more copy of the kept
    rows, still far below the element gather. Elsewhere (the CPU: the row gather is the fastest
    way there) or where a row's last axis is not a whole number of words (quantization scales):
    the element gather of the columns kept."""
    idx = mx.array(rows, dtype=mx.int32)
    row_bytes = x.shape[-1] * x.dtype.size
    if not word_gather_here() or row_bytes % 8:
        return (x[..., first:, :] if first else x)[idx]
    words = mx.view(x, mx.uint64).reshape(x.shape[0], -1)[idx]
    out = mx.view(words, x.dtype).reshape(len(rows), *x.shape[1:])
    return mx.contiguous(out[..., first:, :]) if first else out


def warm_row_copies(cache) -> int:
    """Run, on `cache`'s planes (a batch of at least 3 rows; untouched), the copies that take rows
    out of a batch: a copy of one run and of two (filter / extend_all with few runs), and
    gather_rows of scattered rows with and without dropped columns. Each is a kernel MLX builds on
    its first use in a process on CUDA (one per dtype), which would otherwise land in a client's
    step (runtime/warmup.py). How many planes it ran on."""
    planes = [getattr(cache, n) for n in getattr(cache, "PLANES", ())]
    planes = [x for x in planes if x is not None and x.shape[0] >= 3 and x.shape[2] >= 2]
    out = []
    for x in planes:
        out += [mx.contiguous(x[1:3]), mx.concatenate([x[0:1], x[2:3]], axis=0),
                gather_rows(x, [0, 2]), gather_rows(x, [0, 2], first=1)]
    mx.eval(out)
    return len(planes)


def row_runs(rows: list[int]) -> list[tuple[int, int]]:
    """Increasing row indices as [start, end) runs of consecutive rows ([0, 1, 2, 5, 6] ->
    [(0, 3), (5, 7)]); rows out of order each start a run of their own."""
    runs: list[tuple[int, int]] = []
    for r in rows:
        if runs and r == runs[-1][1]:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return runs
