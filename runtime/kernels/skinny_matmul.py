"""Skinny matmul: `x @ w.T` for 2..64 rows of x (decode batches), streaming w near HBM speed.

Why: on MLX's CUDA backend a matmul with 2..64 rows streams the weights at 0.3-2.7 TB/s
depending on the shape (narrow projections worst; docs/performance.md), so the matmuls of
one batch 8-64 decode step of an 8B model take 7-8 ms against a 3.35 ms roofline. Decode
matmuls are weight-bound: every weight is read once and used for at most 64 rows.

How: the product is computed transposed, y.T [N, M] = w [N, K] . x.T [K, M], on tensor
cores (`mma.sync` m16n8k16, bf16/fp16 in, fp32 accumulate): w's rows are the mma's 16-row
A tiles, x's rows its 8-column B tiles, so one warp owns 16*RT output columns for all M
rows and every weight byte is loaded once, 16 bytes per thread per load, bypassing L1
(x's rows, reused by every warp, stay in L1/L2). The order of k inside a 32-wide chunk
does not change a dot product, so each thread loads 8 consecutive k of a w row and 8 of
an x row (one 16-byte load each) and hands them to two mmas as the k positions the
fragment layout asks for: w and x use the same permutation, so the sum is the same.
Small grids split k over the warps of a block (WK) and add the parts in shared memory in
a fixed order, so one launch does it all and the same inputs give the same bits.

Launch configurations come from `heuristic()`, or from a table measured on the device by
`python -m graphc.benchmarks.kernel_tune --table T.json` and named by a graph's
`decode: {skinny_table: T.json}` (or `Engine(decode_options={"skinny_table": ...})`,
`graphc bench --skinny-table T.json`);
the table also records shapes where MLX's matmul is faster, and those stay with MLX.

It is used by the compiled decode path (runtime/compiled_decode.py) behind a flag
(`Engine(compile=True, skinny_gemm=True)` / a graph's `decode: {skinny_matmul: true}`), only on CUDA, and only
after `check()` has compared it with MLX's matmul on random inputs in this process.
Accumulation order differs from cuBLAS, so results match to bf16 rounding, not bit for bit.
Measured on an H200 it beats MLX on the narrow projections (attention q/k/v and o) by up to
1.9x and loses on the widest (gate+up, a 128k-vocab head) and at 64 rows; hence the flag.
"""

from __future__ import annotations

import json

import mlx.core as mx

from . import Kernel, KernelOp, answers_of, available, cuda_source, in_process_check, restore_answers

MAX_ROWS = 64

_HEADER = cuda_source("skinny_matmul/header.cu")

_SOURCE = cuda_source("skinny_matmul/source.cu")

_kernel = Kernel("graphc_skinny_matmul", ["x", "w"], ["y"], _SOURCE, _HEADER)


def row_tiles(M: int) -> int:
    """8-row x tiles for M rows, rounded up to 1, 2, 4, 8 so few kernel variants get built."""
    MT = 1
    while MT * 8 < M:
        MT *= 2
    return MT


def supports(x: mx.array, w: mx.array) -> bool:
    """Shapes and dtypes the kernel takes; anything else goes to MLX's matmul.

    One row is left to MLX: its matrix-vector kernel already streams near peak."""
    M = x.size // x.shape[-1] if x.ndim else 0
    return (x.dtype in (mx.bfloat16, mx.float16) and w.dtype == x.dtype and w.ndim == 2
            and x.shape[-1] == w.shape[1] and w.shape[1] % 32 == 0 and 2 <= M <= MAX_ROWS)


def heuristic(M: int, K: int, N: int, *, target_warps: int = 2048) -> tuple[int, int, int, int, int]:
    """(MT, RT, UNROLL, WN, WK) when no tuned table entry exists.

    MT: 8-row x tiles; RT: 16-column w tiles per warp (more reuse of each x load);
    UNROLL: 32-wide k chunks whose weight loads are in flight together; WN x WK warps a
    block, WK splitting k inside the block, enough for ~`target_warps` warps in all.
    """
    MT = row_tiles(M)
    RT = 1 if MT <= 2 else 2
    UNROLL = 8 if MT <= 2 else (4 if MT == 4 else 2)
    row_warps = -(-N // (16 * RT))
    WK = 1
    while WK < 8 and row_warps * WK < target_warps and (K // 32) // (2 * WK) >= UNROLL:
        WK *= 2
    WN = max(1, 4 // WK)
    return MT, RT, UNROLL, WN, WK


def fits(MT: int, RT: int, WN: int, WK: int) -> bool:
    """The k-split's shared buffer (WN x RT x MT x 128 floats) fits the 48 KiB static limit."""
    return WK == 1 or WN * RT * MT * 128 * 4 <= 48 * 1024


_table: dict | None = None


def load_table(path: str | None = None) -> dict:
    """{(MT, K, N): config or None} from a tune JSON (the `skinny_table` decode option); None: MLX is
    faster. Every later `plan()` in this process follows it; no path: the heuristic alone."""
    global _table

    table: dict = {}
    if path:
        try:
            with open(path) as f:
                for e in json.load(f)["table"]:
                    cfg = tuple(int(v) for v in e["config"]) if e["config"] else None
                    if cfg is not None and (len(cfg) != 5 or not fits(cfg[0], cfg[1], cfg[3], cfg[4])):
                        raise ValueError(f"entry {e} has no valid configuration")
                    table[(int(e["MT"]), int(e["K"]), int(e["N"]))] = cfg
        except (OSError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"skinny_table {path}: not a skinny-matmul table ({type(err).__name__}: {err}); "
                             "write one with `python -m graphc.benchmarks.kernel_tune --table FILE`") from None
    _table = table
    return table


def plan(M: int, K: int, N: int) -> tuple | None:
    """The launch configuration for an M x K by K x N product, or None where MLX's is faster."""
    table = _table if _table is not None else load_table()
    key = (row_tiles(M), K, N)
    if key in table:
        return table[key]
    return heuristic(M, K, N)


def matmul(x: mx.array, w: mx.array) -> mx.array:
    """x @ w.T: the kernel where it takes the shape and is planned faster, MLX's matmul elsewhere."""
    if supports(x, w) and available():
        M = x.size // x.shape[-1]
        cfg = plan(M, x.shape[-1], w.shape[0])
        if cfg is not None:
            return skinny_matmul(x, w, config=cfg)
    return x @ w.T


def skinny_matmul(x: mx.array, w: mx.array, *, config: tuple | None = None) -> mx.array:
    """x [..., K] @ w[N, K].T for at most MAX_ROWS rows of x; `supports(x, w)` must hold."""
    lead, K = x.shape[:-1], x.shape[-1]
    N = w.shape[0]
    M = x.size // K
    MT, RT, UNROLL, WN, WK = config or heuristic(M, K, N)
    if MT * 8 < M or not fits(MT, RT, WN, WK):
        raise ValueError(f"config {(MT, RT, UNROLL, WN, WK)} does not fit {M} rows / shared memory")
    blocks = -(-N // (WN * 16 * RT))
    (y,) = _kernel(
        inputs=[x.reshape(M, K), w],
        template=[("T", x.dtype), ("BF16", x.dtype == mx.bfloat16), ("MT", MT), ("RT", RT),
                  ("UNROLL", UNROLL), ("WN", WN), ("WK", WK)],
        grid=(blocks * WN * WK * 32, 1, 1),
        threadgroup=(WN * WK * 32, 1, 1),
        output_shapes=[(M, N)],
        output_dtypes=[x.dtype],
    )
    return y.reshape(*lead, N)


def reference(x: mx.array, w: mx.array) -> mx.array:
    return x @ w.T


CHECK_SHAPES = ((2, 256, 48), (3, 512, 200), (8, 4096, 1024), (13, 2048, 4096), (32, 1024, 1000),
                (64, 4096, 6144), (64, 14336, 512))
CHECK_CONFIGS = ((1, 1, 8, 4, 1), (1, 2, 4, 2, 2), (1, 1, 2, 1, 8), (4, 4, 2, 2, 4))  # beside heuristic()


def _check_cases():
    """(dtype, M, K, N, config): every check shape at its heuristic config, the sweep's
    corners on one shape, fp16 once (each distinct config is one more kernel build)."""
    for M, K, N in CHECK_SHAPES:
        yield mx.bfloat16, M, K, N, None
    for c in CHECK_CONFIGS:
        yield mx.bfloat16, 13, 2048, 4096, (max(2, c[0]),) + c[1:]
    yield mx.float16, 32, 1024, 1000, None


def close(got: mx.array, x: mx.array, w: mx.array) -> str | None:
    """None when `got` is x @ w.T to bf16 rounding; else by how much it is not."""
    want = reference(x.astype(mx.float32), w.astype(mx.float32))
    err = mx.max(mx.abs(got.astype(mx.float32) - want)).item()
    scale = mx.max(mx.abs(want)).item()
    return None if err <= 2e-2 * max(scale, 1.0) else f"differs from MLX's matmul by {err:.3g} (max |y| {scale:.3g})"


def _compare(seed: int) -> str | None:
    key = mx.random.key(seed)
    for dtype, M, K, N, cfg in _check_cases():
        k1, k2, key = mx.random.split(key, 3)
        x = mx.random.normal((M, K), key=k1).astype(dtype)
        w = (mx.random.normal((N, K), key=k2) * K ** -0.5).astype(dtype)
        why = close(skinny_matmul(x, w, config=cfg), x, w)
        if why:
            return f"kernel {why} at M={M} K={K} N={N} {dtype} config {cfg or heuristic(M, K, N)}"
    return None


# None when the kernel matches MLX's matmul on random inputs here; else why not.
check = in_process_check(_compare)


class SkinnyMatmul(KernelOp):
    """x @ w.T for 2..MAX_ROWS rows (`skinny_matmul`)."""

    name = "skinny_matmul"

    def applies(self, x: mx.array, w: mx.array) -> bool:
        return supports(x, w)

    def check(self, seed: int = 0) -> str | None:
        return check(seed)

    def reference(self, *args, **kwargs):
        return reference(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return skinny_matmul(*args, **kwargs)

    def stored_verdicts(self) -> dict:
        return {"check": answers_of(check)}

    def restore_verdicts(self, stored: dict) -> None:
        restore_answers(check, stored["check"])


KERNEL = SkinnyMatmul()
