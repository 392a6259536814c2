"""A sampled row's top-p scan, filters and Gumbel-max over its first K ranks, in one launch.

After the top-ranks kernel (top_ranks.py) a fused sampled step has, per row, its first K ranks'
ids, scaled logits s and uniform noise u. `choose.choose` turns them into a token with MLX's ops:
exp(s − s_0) over the kept ranks and its inclusive prefix sums (`choose.top_p_sums`: a fused
elementwise kernel and `mx.cumsum`), the sums' total at rank top_k − 1 (a gather), the exclusive
sums (a concatenate), the keep mask, s + Gumbel noise, an argmax and a gather of the id — seven
launches, each encoded on the host, and at Llama-3.2-1B batch 64 the step is bound by that host
encode (`step_profile`: `submit` 2.5 of a 3.7 ms step). Here one block a row does all of it:

    p     = exp(s_r − s_0), 0 where rank ≥ min(top_k, K)        (use_top_p; the mask with use_top_k)
    c     = inclusive prefix sums of p, in the association order of MLX's CUDA `cumsum`
    keep  = rank < min(top_k, K)                                  (use_top_k)
          & (excl_r < top_p · c[min(top_k, K) − 1]  or  top_p ≥ 1)  (use_top_p)
          & (s_r − s_0 ≥ log min_p)                                (use_min_p)
    token = ids[argmax over kept ranks of s_r − log(−log(u_r))]    (lowest rank on ties)

The scan is where bits could drift: float addition is not associative, and a top-p boundary
compares against a sum. So the kernel adds in exactly the order MLX's `contiguous_scan`
(mlx/backend/cuda/scan.cu) does for a row of K ≤ 256 floats: ceil(K / 4) threads rounded up to
whole warps, four consecutive values a thread added left to right, an exclusive Kogge–Stone
warp scan of the thread totals (cooperative_groups' `exclusive_scan`: shuffles up by 1, 2, 4, 8,
16, then one up), the previous warp's total for the second warp, and the three adds of MLX's
output line in its order (`graphc_mlx_cumsum` in `_HEADER` below). Every other operation is
exact or the same correctly rounded float function MLX's kernels call (libdevice's `expf` and `logf`, as MLX's `Exp` and
`Log`; IEEE compares, one subtract, one add, one multiply; MLX builds without fast math, and this
kernel goes through the same NVRTC), and the argmax keeps MLX's rule (the larger value, the
lower index on ties), so a row picks the token `choose.choose` picks. `check_config()` compares
the two on this device before a configuration (K and the filters in use) is first used, on
random rows with and without ties and with masked ranks, against `choose.choose` compiled as
the fused step compiles it; otherwise MLX's ops run (`check()` does every configuration at once,
for the bench). NaN logits may pick differently (as in top_ranks.py).

Why the scan is inside rather than MLX's own `mx.cumsum` read by the kernel: that is two launches
more a sampled step with top-p, and a batch-64 step is bound by the host's encode of its launches
(what the two are worth end to end is within the spread between H200 sessions).
"""

from __future__ import annotations

import functools

import mlx.core as mx

from ..token_math.choose import choose as mlx_choose
from ..token_math.choose import rank_masks
from ..token_math.choose import top_p_sums as mlx_sums
from ..token_math.noise import gumbel_from_uniform
from . import Kernel, KernelOp, cuda_source, in_process_check

# MLX's CUDA `cumsum` of one contiguous row of K <= 256 floats (mlx/backend/cuda/scan.cu,
# contiguous_scan, inclusive, N_READS = 4), in place in shared memory, with its additions in its
# order: block_dim = ceil(K / 4) rounded up to whole warps (one warp up to K = 128, two at 256).
# cooperative_groups' exclusive_scan over a warp is an inclusive Kogge-Stone scan (out + shfl_up
# by 1, 2, 4, 8, 16) shifted up by one lane, lane 0 getting 0; over at most two warps, the second
# warp's exclusive warp sum is the first warp's total itself. Called by every thread of the block.
_HEADER = cuda_source("gumbel_choose/header.cu")

_SOURCE = cuda_source("gumbel_choose/source.cu")

_kernel = Kernel("graphc_gumbel_choose", ["s", "ids", "u", "top_k", "top_p", "log_min_p"], ["token"], _SOURCE,
                 header=_HEADER)

# The kernel's prefix sums alone, for check(): they must equal choose.top_p_sums bit for bit (random
# magnitudes: an addition in another order would show), which a token comparison alone would
# catch only when a sum lands on a top-p boundary.
_SUMS_SOURCE = cuda_source("gumbel_choose/sums_source.cu")
_sums_kernel = Kernel("graphc_top_p_sums", ["s", "top_k"], ["sums"], _SUMS_SOURCE, header=_HEADER)

MAX_WIDTH = 256


def takes(width: int) -> bool:
    """Widths the kernel takes: one thread a rank, a power of two from 16 to MAX_WIDTH."""
    return 16 <= width <= MAX_WIDTH and width & (width - 1) == 0


def usable(width: int, use_top_k: bool, use_top_p: bool, use_min_p: bool) -> bool:
    """The kernel takes this width (one thread a rank) and, in this configuration, matched MLX here
    (`check_config`; False off CUDA)."""
    return takes(width) and check_config(width, use_top_k, use_top_p, use_min_p) is None


def choose(s: mx.array, ids: mx.array, u: mx.array, top_k: mx.array, top_p: mx.array, log_min_p: mx.array, *,
           use_top_k: bool, use_top_p: bool, use_min_p: bool) -> mx.array:
    """Tokens int32 [B] (see the module doc). s, u float32 [B, K]; ids int32 [B, K]; per-row top_k
    int32, top_p and log_min_p float32 [B]."""
    b, k = s.shape
    threads = max(k, 32)  # the scan runs in whole warps
    return _kernel(
        inputs=[s, ids, u, top_k.astype(mx.int32), top_p.astype(mx.float32), log_min_p.astype(mx.float32)],
        template=[("K", k), ("USE_TOP_K", use_top_k), ("USE_TOP_P", use_top_p), ("USE_MIN_P", use_min_p)],
        grid=(b * threads, 1, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(b,)],
        output_dtypes=[mx.int32],
    )[0]


def top_p_sums(s: mx.array, top_k: mx.array, *, use_top_k: bool) -> mx.array:
    """The kernel's top-p prefix sums float32 [B, K] (what choose.top_p_sums gives; for check())."""
    b, k = s.shape
    threads = max(k, 32)
    return _sums_kernel(inputs=[s, top_k.astype(mx.int32)], template=[("K", k), ("MASK", use_top_k)],
                        grid=(b * threads, 1, 1), threadgroup=(threads, 1, 1),
                        output_shapes=[(b, k)], output_dtypes=[mx.float32])[0]


def _mlx_sums(s, top_k, *, use_top_k: bool):
    """choose.top_p_sums as the fused selection runs it (compiled; its keep_k from choose.rank_masks)."""
    if not use_top_k:
        return mx.compile(lambda x: mlx_sums(x, None))(s)
    return mx.compile(mlx_sums)(s, rank_masks(top_k, s.shape[1])[0])


def _mlx_choose(s, ids, u, top_k, top_p, log_min_p, *, use_top_k: bool, use_top_p: bool, use_min_p: bool):
    return mlx_choose(s, ids, gumbel_from_uniform(u), top_k, top_p, log_min_p,
                      use_top_k=use_top_k, use_top_p=use_top_p, use_min_p=use_min_p)


def reference(s, ids, u, top_k, top_p, log_min_p, *, use_top_k: bool, use_top_p: bool, use_min_p: bool):
    """The same tokens from MLX's ops, compiled as the fused selection compiles them when the kernel
    is off (sampling/fused.py: its exp and mask are one fused kernel there, its scan MLX's cumsum)."""
    fn = mx.compile(functools.partial(_mlx_choose, use_top_k=use_top_k, use_top_p=use_top_p, use_min_p=use_min_p))
    return fn(s, ids, u, top_k, top_p, log_min_p)


FLAGS = tuple((k, p, m) for k in (False, True) for p in (False, True) for m in (False, True))
# (B, K, tie step of s or 0) that check() compares at, every filter combination each
CHECK_CASES = ((64, 64, 0.0), (5, 16, 0.5), (3, 128, 0.0), (7, 256, 0.25), (4, 32, 0.0))


def _compare(seed: int, cases=CHECK_CASES, flags=FLAGS) -> str | None:
    key = mx.random.key(seed)
    for (B, K, tie) in cases:
        k1, k2, k3, k4, k5, k6, key = mx.random.split(key, 7)
        # descending scaled logits in rank order (as the top-ranks kernel gives them), masked ranks
        s = -mx.sort(-mx.random.normal((B, K), key=k1) * 2.0, axis=-1)
        if tie:
            s = mx.round(s / tie) * tie
        s = mx.where(mx.random.uniform(shape=(B, K), key=k2) < 0.05, -mx.inf, s)
        s = mx.concatenate([mx.maximum(s[:, :1], 0.0), s[:, 1:]], axis=1)  # rank 0 finite
        ids = mx.random.randint(0, 200000, (B, K), key=k3).astype(mx.int32)
        u = mx.clip(mx.random.uniform(shape=(B, K), key=k4), 2.0**-32, 1 - 2.0**-24)
        top_k = mx.random.randint(1, K + 8, (B,), key=k5).astype(mx.int32)
        k6a, k6b = mx.random.split(k6)
        top_p = mx.where(mx.arange(B) % 3 == 0, 1.0, mx.random.uniform(0.05, 1.0, (B,), key=k6a))
        log_min_p = mx.where(mx.arange(B) % 2 == 0, -mx.inf, mx.log(mx.random.uniform(0.001, 0.5, (B,), key=k6b)))
        for use_k in sorted({f[0] for f in flags if f[1]}):  # the sums, bit for bit, where top-p is in use
            want = _mlx_sums(s, top_k, use_top_k=use_k).view(mx.uint32)
            got = top_p_sums(s, top_k, use_top_k=use_k).view(mx.uint32)
            if not mx.array_equal(got, want).item():
                bad = int(mx.sum(got != want).item())
                return (f"Gumbel-choose kernel's top-p sums differ from MLX's in {bad} of {B * K} at K={K} "
                        f"(top_k {use_k})")
        for use_k, use_p, use_m in flags:
            want = reference(s, ids, u, top_k, top_p, log_min_p, use_top_k=use_k, use_top_p=use_p, use_min_p=use_m)
            got = choose(s, ids, u, top_k, top_p, log_min_p, use_top_k=use_k, use_top_p=use_p, use_min_p=use_m)
            if not mx.array_equal(got, want).item():
                bad = int(mx.sum(got != want).item())
                return (f"Gumbel-choose kernel differs from MLX in {bad} of {B} tokens at K={K} "
                        f"(top_k {use_k}, top_p {use_p}, min_p {use_m})")
    return None


# None when the kernel picked MLX's tokens on every case and configuration here; else why not (all 40
# builds: the tests' and the bench's check; the engine asks check_config per configuration instead).
check = in_process_check(_compare)

_configs: dict = {}  # (K, use_top_k, use_top_p, use_min_p) -> check_config's answer


def check_config(width: int, use_top_k: bool, use_top_p: bool, use_min_p: bool) -> str | None:
    """`check()` for one configuration (one kernel build), on first use of it in this process:
    rows with and without ties at this width. A fused step builds and checks only the
    configuration its rows need, so an engine's first sampled step on a fresh machine pays one
    NVRTC build here, not the 40 of every width and filter combination."""
    key = (width, bool(use_top_k), bool(use_top_p), bool(use_min_p))
    if key not in _configs:
        cases = ((64, width, 0.0), (7, width, 0.5), (5, width, 0.25))
        _configs[key] = in_process_check(lambda seed: _compare(seed, cases, (key[1:],)))()
    return _configs[key]


def note() -> str:
    """For the plan at load: configurations are checked on first use, so it says how."""
    if not _configs:
        return "on where its check passes (one check per width and filter combination, on first use)"
    ok = [k for k, why in _configs.items() if why is None]
    bad = [f"{_label(k)}: {why}" for k, why in _configs.items() if why is not None]
    return "; ".join(([f"on for {', '.join(map(_label, ok))}"] if ok else []) + ([f"off for {'; '.join(bad)}"] if bad else []))


def _label(config: tuple) -> str:
    width, *flags = config
    on = [name for name, f in zip(("top-k", "top-p", "min-p"), flags) if f]
    return f"K={width} ({' + '.join(on) or 'no filter'})"


class GumbelChoose(KernelOp):
    """Top-p scan, filters and Gumbel-max over the K ranks in one launch (`choose`)."""

    name = "gumbel_choose"

    def applies(self, width: int) -> bool:
        return takes(width)

    def check(self, seed: int = 0) -> str | None:
        return check(seed)

    def reference(self, *args, **kwargs):
        return reference(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return choose(*args, **kwargs)


KERNEL = GumbelChoose()
