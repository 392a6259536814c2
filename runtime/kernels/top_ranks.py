"""The first K ranks of every logits row in one launch — the candidate search of a sampled step.

What it computes is exactly `sampling.select.first_rank_neg_keys(x, K)`: for each row of x
[B, V], the K largest rank keys `(order(float32 logit) << 32) | (0xFFFFFFFF - id)` (the rank
order of docs/sampling.md: logit descending, lower id first on ties), bit-inverted and in
ascending order, uint64 [B, K]. Keys are integers and unique per row, so the answer is one
bit pattern: the kernel must match MLX's ops bit for bit, not to rounding, and `check()`
compares them that way (ties included: bf16 logits at V = 128k have many).

Why: on MLX's CUDA backend the same search is a chain of about eight launches per step (a max
per block, the block keys, a partition over [B, V / 32] block keys, a gather, the token keys,
a partition over [B, 32 K], a sort, a slice), each encoded on the host; at batch 64 a sampled
decode step cost 8-30 % more than a greedy one in runs 6-16 (docs/performance.md), the issue's
goal being 5 %. Here one block of 512 threads per row does it all in shared memory:

  1. the best token of every BK-token block as a key (order(max), 0xFFFFFFFF - block index);
  2. a bitonic sort of those block keys: the first K blocks hold the first K ranks
     (select._block_candidates says why; the proof does not depend on BK);
  3. the K * BK tokens of those blocks as rank keys, a bitonic sort, the first K written out.

It runs only on CUDA, inside the fused selection (sampling/fused.py), for shapes `fits()`
takes, and only after `check()` matched it with MLX's ops in this process; otherwise the MLX
ops run. NaN logits may rank differently (MLX's max propagates a NaN whatever its sign bit).
"""

from __future__ import annotations

import mlx.core as mx

from . import Kernel, in_process_check

THREADS = 512  # 1,024 would cap registers at 64 a thread (the signature has no __launch_bounds__)
CAP = 4096  # shared-memory keys: 32 KB of uint64, the block keys of stage 1 and the tokens of stage 3
MAX_WIDTH = 256  # K; also the size of the block-index table

_HEADER = r"""
__device__ __forceinline__ unsigned int graphc_order_bits(float f) {
  // select._order_keys: -0.0 as +0.0; IEEE order -> unsigned order
  unsigned int b = __float_as_uint(f);
  if (b == 0x80000000u) b = 0u;
  return (b >> 31) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ void graphc_sort_desc(unsigned long long* s, int n) {
  // bitonic sort of s[0, n) (n a power of two) into descending order, all threads of the block
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int p = i ^ j;
        if (p > i) {
          const unsigned long long a = s[i], b = s[p];
          if (((i & k) == 0) ? (a < b) : (a > b)) { s[i] = b; s[p] = a; }
        }
      }
      __syncthreads();
    }
  }
}
"""

_SOURCE = r"""
    // One block per row. Template: T (logits dtype), K (ranks wanted), BK (tokens per block),
    // P (block count rounded up to a power of two). K * BK <= CAP and P <= CAP (host checks).
    const int V = x_shape[1];
    const int G = (V + BK - 1) / BK;
    const int row = blockIdx.x;
    const T* xr = x + (size_t)row * V;
    __shared__ unsigned long long s[CAP];
    __shared__ int top[K];

    // 1. block keys; a thread takes whole blocks so its BK loads are independent of each other
    for (int j = threadIdx.x; j < P; j += blockDim.x) {
      unsigned long long key = 0ull;  // padding: below every real key
      if (j < G) {
        unsigned int o = 0u;
        const int t0 = j * BK;
        if (t0 + BK <= V) {
#pragma unroll
          for (int i = 0; i < BK; ++i) o = max(o, graphc_order_bits(static_cast<float>(xr[t0 + i])));
        } else {
          for (int t = t0; t < V; ++t) o = max(o, graphc_order_bits(static_cast<float>(xr[t])));
        }
        key = ((unsigned long long)o << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned int)j);
      }
      s[j] = key;
    }
    __syncthreads();
    // 2. the K best blocks
    graphc_sort_desc(s, P);
    if (threadIdx.x < K) top[threadIdx.x] = (int)(0xFFFFFFFFu - (unsigned int)(s[threadIdx.x] & 0xFFFFFFFFull));
    __syncthreads();
    // 3. their tokens' rank keys (consecutive threads read consecutive tokens), the K best
    constexpr int N = K * BK;
    for (int c = threadIdx.x; c < N; c += blockDim.x) {
      const int t = top[c / BK] * BK + (c % BK);
      s[c] = (t < V) ? (((unsigned long long)graphc_order_bits(static_cast<float>(xr[t])) << 32) |
                        (unsigned long long)(0xFFFFFFFFu - (unsigned int)t))
                     : 0ull;
    }
    __syncthreads();
    graphc_sort_desc(s, N);
    if (threadIdx.x < K) out[(size_t)row * K + threadIdx.x] = ~s[threadIdx.x];
"""

_kernel = Kernel("graphc_top_ranks", ["x"], ["out"], _SOURCE.replace("CAP", str(CAP)), header=_HEADER)


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


def fits(x_shape, width: int) -> bool:
    return len(x_shape) == 2 and layout(x_shape[-1], width) is not None


def first_rank_neg_keys(x: mx.array, width: int) -> mx.array:
    """The kernel's `select.first_rank_neg_keys(x, width)`: uint64 [B, width] (see the module doc)."""
    b, v = x.shape
    lay = layout(v, width)
    if lay is None:
        raise ValueError(f"the top-ranks kernel does not take {width} ranks of {v} logits")
    bk, p = lay
    if x.dtype not in (mx.bfloat16, mx.float16, mx.float32):
        x = x.astype(mx.float32)
    (out,) = _kernel(
        inputs=[x],
        template=[("T", x.dtype), ("K", width), ("BK", bk), ("P", p)],
        grid=(b * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(b, width)],
        output_dtypes=[mx.uint64],
    )
    return out


def _compare(seed: int) -> str | None:
    from ..sampling.select import first_rank_neg_keys as reference

    key = mx.random.key(seed)
    cases = ((64, 128256, 64, mx.bfloat16, 1.0), (3, 128256, 16, mx.float32, 1.0), (5, 32000, 128, mx.bfloat16, 1.0),
             (2, 151936, 64, mx.bfloat16, 1.0), (4, 50000, 32, mx.float16, 1.0), (2, 1000, 16, mx.float32, 1.0),
             # few distinct values: ties everywhere, decided by the id
             (8, 128256, 64, mx.bfloat16, 0.0))
    for (B, V, K, dt, spread) in cases:
        k1, k2, key = mx.random.split(key, 3)
        if spread:
            x = (3.0 * mx.random.normal((B, V), key=k1)).astype(dt)
        else:  # and -0.0 next to +0.0, which rank as equals
            x = mx.random.randint(-4, 4, (B, V), key=k1).astype(dt) * mx.where(mx.arange(V) % 3 == 0, -1, 1).astype(dt)
        # masked tokens (-inf)
        x = mx.where(mx.random.uniform(shape=(B, V), key=k2) < 0.1, mx.array(float("-inf"), dt), x)
        want = reference(x, K)
        got = first_rank_neg_keys(x, K)
        if not mx.array_equal(got, want).item():
            bad = int(mx.sum(got != want).item())
            return f"top-ranks kernel differs from MLX's candidate search in {bad} keys at B={B} V={V} K={K} {dt}"
    return None


# None when the kernel matched MLX's candidate search bit for bit on random logits here; else why not.
check = in_process_check(_compare)


def note() -> str:
    """On, or why not (after `check()`); for the plan and the bench."""
    why = check()
    return "on (one launch per step, runtime/kernels/top_ranks.py)" if why is None else f"off ({why})"
