"""The first K ranks of every logits row, with their scaled logits and noise, in one launch: the
candidate stage of a fused sampled step.

For each row of x [B, V] it computes what sampling/fused.py computes with MLX's ops before the
filters (top-k / top-p / min-p) and the Gumbel-max:

  ids  int32 [B, K]    the first K ranks' token ids, in rank order (logit descending, lower id
                       first on ties: `ranks.first_rank_neg_keys` and `decode_neg_keys`)
  s    float32 [B, K]  their logits times the row's 1 / T
  u    float32 [B, K]  their uniform noise (noise.py: murmur of the row state, the position and
                       the id; u = clip((float(h) + 0.5) * 2**-32, 2**-32, 1 - 2**-24))

All of it is integer work or one correctly rounded float operation each (`__fmul_rn`,
`__fadd_rn`, `__uint2float_rn`), so the outputs are bit patterns that must equal MLX's, not
approximations; `check()` compares them that way (ties included: bf16 logits at V = 128k have
many). What follows them stays in MLX's ops (choose.choose: exp, the prefix scan, the logs of
the Gumbel noise), so a seeded row draws the same token with or without the kernel.

Why: on MLX's CUDA backend the same work was about 18 launches per step (a max per block, the
block keys, a partition over [B, V / 32] block keys, a gather, the token keys, a partition over
[B, 32 K], a sort, the id and value decoding, the scaling, four murmur kernels), each encoded on
the host, and a batch-64 decode step is bound by that host encode: a sampled step cost ~0.3 ms
(+9 %) more than a greedy one at Llama-3.2-1B batch 64 (H200). Here one
block of 512 threads per row does it in shared memory:

  1. the best token of every BK-token block as a key (order(max), 0xFFFFFFFF - block index);
  2. the K largest block keys: the first K blocks hold the first K ranks
     (ranks._block_candidates says why; the proof does not depend on BK);
  3. the K * BK tokens of those blocks as rank keys, the K largest, decoded.

"The K largest" of stages 2 and 3 comes in two variants (`_VARIANTS`): a radix select of the
K-th key (up to 8 histogram passes of 8 bits, fewer when a bin holds exactly the keys still
needed), then each of the K keys at or above it placed by its rank, with stage 1 reading each
block in 16-byte loads; or a bitonic sort of all of them and one
load per element (the first kernel, 78 passes at 4,096 keys). `check()` tries the select first
and falls back to the sort; `note()` says which runs.

It runs only on CUDA, inside the fused selection, for shapes `layout()` takes, and only after
`check()` matched it with MLX's ops in this process; otherwise MLX's ops run. NaN logits may
rank differently (MLX's max propagates a NaN whatever its sign bit).
"""

from __future__ import annotations

import mlx.core as mx

from ..token_math.murmur import murmur_absorb
from ..token_math.noise import uniform_noise
from ..token_math.ranks import decode_neg_keys, first_rank_neg_keys
from . import Kernel, KernelOp, answers_of, cuda_source, in_process_check, restore_answers

THREADS = 512  # 1,024 would cap registers at 64 a thread (the signature has no __launch_bounds__)
CAP = 4096  # shared-memory keys: 32 KB of uint64, the block keys of stage 1 and the tokens of stage 3
MAX_WIDTH = 256  # K; also the size of the block-index table

_HEADER = cuda_source("top_ranks/header.cu")

_SOURCE = cuda_source("top_ranks/source.cu")

# Stage 1's max over a whole block: BK loads of one element (the first kernel), or 16-byte loads
# where the row is 16-byte aligned (BK * sizeof(T) is a multiple of 16 for every BK layout() picks).
_BLOCK_MAX_SCALAR = cuda_source("top_ranks/block_max_scalar.cu")
_BLOCK_MAX_VEC = cuda_source("top_ranks/block_max_vec.cu").replace("@SCALAR@", _BLOCK_MAX_SCALAR)

# How s[0, K) gets the K largest keys of s[0, n), in order, at stages 2 and 3: a bitonic sort of
# all n (the first kernel, kept as it was: the fallback), or a radix select of the K-th key and a
# rank of the K at or above it (fewer passes over shared memory: at most 8 histogram passes
# against 78 sort passes at n = 4,096), with stage 1's 16-byte loads.
_VARIANTS = {
    "sort": ("", "graphc_sort_desc(s, {n})", _BLOCK_MAX_SCALAR),
    "select": ("__shared__ unsigned long long sel[K]; __shared__ unsigned int hist[256]; "
               "__shared__ unsigned long long sh_key[1]; __shared__ int sh_int[3];",
               "graphc_top_select(s, {n}, K, sel, hist, sh_key, sh_int)", _BLOCK_MAX_VEC),
}


def _variant_source(name: str) -> str:
    extra, first_k, block_max = _VARIANTS[name]
    src = _SOURCE.replace("CAP", str(CAP)).replace("SHARED_EXTRA", extra).replace("BLOCK_MAX", block_max)
    return src.replace("FIRST_K(P)", first_k.format(n="P")).replace("FIRST_K(N)", first_k.format(n="N"))


_kernels = {name: Kernel(f"graphc_top_ranks_{name}", ["x", "inv_t", "h", "pos"], ["ids", "scaled", "u"],
                         _variant_source(name), header=_HEADER) for name in _VARIANTS}


def _as(a: mx.array, dtype) -> mx.array:
    return a if a.dtype == dtype else a.astype(dtype)  # no cast node when it already is


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def layout(v: int, width: int) -> tuple[int, int] | None:
    """(BK, P) for a row of ``v`` logits and ``width`` ranks, or None where the kernel does not
    apply: width a power of two in 16..MAX_WIDTH, at least ``width`` blocks, and both the block
    keys and the width * BK candidate keys within CAP."""
    if width < 16 or width > MAX_WIDTH or width & (width - 1) or width >= v:
        return None
    for bk in (32, 64, 128):
        g = -(-v // bk)
        if g <= CAP and width * bk <= CAP and g >= width:
            return bk, _pow2(g)
    return None


def candidates(x: mx.array, width: int, inv_t: mx.array, h: mx.array, positions: mx.array,
               variant: str | None = None):
    """(ids, s, u) of the first ``width`` ranks of every row of x [B, V] (see the module doc).
    inv_t float32 [B]: 1 / T per row; h uint32 [B]: the row's noise state before the position
    (seed words absorbed); positions int [B]: where the chosen token goes. ``variant``: "sort"
    or "select" (_VARIANTS); None takes the one `check()` chose."""
    b, v = x.shape
    lay = layout(v, width)
    if lay is None:
        raise ValueError(f"the top-ranks kernel does not take {width} ranks of {v} logits")
    bk, p = lay
    if x.dtype not in (mx.bfloat16, mx.float16, mx.float32):
        x = x.astype(mx.float32)
    return _kernels[variant or chosen()](
        inputs=[x, _as(inv_t, mx.float32), _as(h, mx.uint32), _as(positions, mx.int32)],
        template=[("T", x.dtype), ("K", width), ("BK", bk), ("P", p)],
        grid=(b * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(b, width)] * 3,
        output_dtypes=[mx.int32, mx.float32, mx.float32],
    )


def reference(x: mx.array, width: int, inv_t: mx.array, h: mx.array, positions: mx.array):
    """The same three arrays from MLX's ops: what the fused selection computes without the kernel."""
    ids, sv = decode_neg_keys(first_rank_neg_keys(x, width))
    state = murmur_absorb(h, positions.astype(mx.uint32))
    return ids, sv.astype(mx.float32) * inv_t[:, None], uniform_noise(state, ids)


# (B, V, K, dtype, spread) that check() compares each variant at (spread 0: few distinct values, ties
# everywhere, decided by the id); benchmarks/kernel_builds.py builds every one of them for the H200 too.
CHECK_CASES = ((64, 128256, 64, mx.bfloat16, 1.0), (3, 128256, 16, mx.float32, 1.0), (5, 32000, 128, mx.bfloat16, 1.0),
               (2, 151936, 64, mx.bfloat16, 1.0), (4, 50000, 32, mx.float16, 1.0), (2, 1000, 16, mx.float32, 1.0),
               (8, 128256, 64, mx.bfloat16, 0.0))


def _compare(seed: int, variant: str) -> str | None:
    key = mx.random.key(seed)
    for (B, V, K, dt, spread) in CHECK_CASES:
        k1, k2, k3, k4, k5, key = mx.random.split(key, 6)
        if spread:
            x = (3.0 * mx.random.normal((B, V), key=k1)).astype(dt)
        else:  # and -0.0 next to +0.0, which rank as equals
            x = mx.random.randint(-4, 4, (B, V), key=k1).astype(dt) * mx.where(mx.arange(V) % 3 == 0, -1, 1).astype(dt)
        # masked tokens (-inf)
        x = mx.where(mx.random.uniform(shape=(B, V), key=k2) < 0.1, mx.array(float("-inf"), dt), x)
        inv_t = 1.0 / mx.random.uniform(0.1, 3.0, (B,), key=k3)
        h = mx.random.randint(0, 2**31 - 1, (B,), key=k4).astype(mx.uint32) * 3  # the whole uint32 range
        pos = mx.random.randint(0, 100000, (B,), key=k5)
        want = reference(x, K, inv_t, h, pos)
        got = candidates(x, K, inv_t, h, pos, variant=variant)
        for name, g, w in zip(("ids", "scaled logits", "noise"), got, want):
            if g.dtype == mx.float32:
                g, w = g.view(mx.uint32), w.view(mx.uint32)
            if not mx.array_equal(g, w).item():
                bad = int(mx.sum(g != w).item())
                return f"top-ranks kernel ({variant}) differs from MLX in {bad} {name} at B={B} V={V} K={K} {dt}"
    return None


_chosen: dict = {"variant": "sort", "select": "not checked"}  # what check() found


def _compare_variants(seed: int) -> str | None:
    """The radix-select kernel where it matches MLX; else the sorting one; else why neither."""
    def tried(variant):
        try:
            return _compare(seed, variant)
        except Exception as e:  # noqa: BLE001 - a build failure of one variant leaves the other
            return f"top-ranks kernel ({variant}) failed: {type(e).__name__}: {e}"

    why_select = tried("select")
    _chosen["select"] = why_select
    if why_select is None:
        _chosen["variant"] = "select"
        return None
    _chosen["variant"] = "sort"
    why_sort = tried("sort")
    return None if why_sort is None else f"{why_sort}; {why_select}"


# None when a variant of the kernel matched MLX's ops bit for bit on random logits here; else why
# not. It also picks the variant candidates() runs (chosen()).
check = in_process_check(_compare_variants)


def chosen() -> str:
    """The variant `check()` found matching: "select" first, else "sort" (before a check: "sort")."""
    return _chosen["variant"]


def note() -> str:
    """On, or why not (after `check()`); for the plan and the bench."""
    why = check()
    if why is not None:
        return f"off ({why})"
    if chosen() == "select":
        return "on (radix select, one launch a step, runtime/kernels/top_ranks.py)"
    return f"on (bitonic sort, one launch a step; radix select off: {_chosen['select']})"


class TopRanks(KernelOp):
    """The first `width` ranks of each row, their scaled logits and noise (`candidates`)."""

    name = "top_ranks"

    def applies(self, vocab_size: int, width: int) -> bool:
        return layout(vocab_size, width) is not None

    def check(self, seed: int = 0) -> str | None:
        return check(seed)

    def reference(self, *args, **kwargs):
        return reference(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return candidates(*args, **kwargs)

    def stored_verdicts(self) -> dict:
        return {"check": answers_of(check), "chosen": dict(_chosen)}  # the variant is part of the verdict

    def restore_verdicts(self, stored: dict) -> None:
        restore_answers(check, stored["check"])
        _chosen.update(stored["chosen"])


KERNEL = TopRanks()
