"""The first K ranks of every logits row, with their scaled logits and noise, in one launch: the
candidate stage of a fused sampled step.

For each row of x [B, V] it computes what sampling/fused.py computes with MLX's ops before the
filters (top-k / top-p / min-p) and the Gumbel-max:

  ids  int32 [B, K]    the first K ranks' token ids, in rank order (logit descending, lower id
                       first on ties: `select.first_rank_neg_keys` and `decode_neg_keys`)
  s    float32 [B, K]  their logits times the row's 1 / T
  u    float32 [B, K]  their uniform noise (noise.py: murmur of the row state, the position and
                       the id; u = clip((float(h) + 0.5) * 2**-32, 2**-32, 1 - 2**-24))

All of it is integer work or one correctly rounded float operation each (`__fmul_rn`,
`__fadd_rn`, `__uint2float_rn`), so the outputs are bit patterns that must equal MLX's, not
approximations; `check()` compares them that way (ties included: bf16 logits at V = 128k have
many). What follows them stays in MLX's ops (select.choose: exp, the prefix scan, the logs of
the Gumbel noise), so a seeded row draws the same token with or without the kernel.

Why: on MLX's CUDA backend the same work was about 18 launches per step (a max per block, the
block keys, a partition over [B, V / 32] block keys, a gather, the token keys, a partition over
[B, 32 K], a sort, the id and value decoding, the scaling, four murmur kernels), each encoded on
the host, and a batch-64 decode step is bound by that host encode: a sampled step cost ~0.3 ms
(+9 %) more than a greedy one at Llama-3.2-1B batch 64 (docs/performance.md, run 17). Here one
block of 512 threads per row does it in shared memory:

  1. the best token of every BK-token block as a key (order(max), 0xFFFFFFFF - block index);
  2. the K largest block keys: the first K blocks hold the first K ranks
     (select._block_candidates says why; the proof does not depend on BK);
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

from ..sampling.murmur import murmur_absorb
from ..sampling.noise import uniform_noise
from ..sampling.select import decode_neg_keys, first_rank_neg_keys
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

__device__ __forceinline__ unsigned int graphc_absorb(unsigned int h, unsigned int w) {
  // murmur.murmur_absorb: one 4-byte block of MurmurHash3_x86_32's body
  unsigned int k = w * 0xCC9E2D51u;
  k = (k << 15) | (k >> 17);
  k *= 0x1B873593u;
  h ^= k;
  h = (h << 13) | (h >> 19);
  return h * 5u + 0xE6546B64u;
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

__device__ __forceinline__ void graphc_top_select(unsigned long long* s, const int n, const int k,
                                                  unsigned long long* sel, unsigned int* hist,
                                                  unsigned long long* sh_key, int* sh_int) {
  // s[0, k) := the k largest keys of s[0, n), descending. Keys are unique but for zero padding,
  // which ranks below every real key, and there are at least k real keys (layout() sees to it).
  // 1. radix select of the k-th largest key, 8 bits a pass from the top: a 256-bin histogram of
  //    the keys that share the bits found so far, then the bin that holds the k-th of them. When
  //    that bin holds exactly the keys still needed, every key in it is taken and the passes
  //    stop early: the keys at or above `prefix` (its lower bits zero) are then exactly the k
  //    (random logits: after 2-3 of the 8 passes)
  unsigned long long prefix = 0ull, mask = 0ull;
  int need = k;  // the rank of the k-th key among the keys under `prefix`
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) sh_int[2] = 0;  // "done": written by the finding lane, read after a sync
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0u;
    __syncthreads();
    for (int i0 = 0; i0 < n; i0 += blockDim.x) {  // every thread takes every trip: whole warps below
      const int i = i0 + threadIdx.x;
      int bin = -1;
      if (i < n) {
        const unsigned long long key = s[i];
        if ((key & mask) == prefix) bin = (int)((key >> shift) & 0xFFull);
      }
      const unsigned int same = __match_any_sync(__activemask(), bin);  // one atomic per bin a warp
      if (bin >= 0 && lane == __ffs(same) - 1) atomicAdd(&hist[bin], (unsigned int)__popc(same));
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // lane l holds bins 255 - 8l down to 248 - 8l; a scan over the lanes finds the bin
      unsigned int c = 0u;
      for (int j = 0; j < 8; ++j) c += hist[255 - 8 * lane - j];
      unsigned int cum = c;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned int t = __shfl_up_sync(0xFFFFFFFFu, cum, o);
        if (lane >= o) cum += t;
      }
      const unsigned int hit = __ballot_sync(0xFFFFFFFFu, cum >= (unsigned int)need);
      if (lane == __ffs(hit) - 1) {
        unsigned int above = cum - c;
        int b = 255 - 8 * lane;
        // within this lane's 8 bins by the scan; the bound only keeps a broken invariant in range
        while (b > 248 - 8 * lane && above + hist[b] < (unsigned int)need) above += hist[b--];
        sh_int[0] = need - (int)above;
        sh_int[2] = hist[b] == (unsigned int)need - above;  // the whole bin is needed: done
        sh_key[0] = prefix | ((unsigned long long)b << shift);
      }
    }
    __syncthreads();
    need = sh_int[0];
    prefix = sh_key[0];
    mask |= 0xFFull << shift;
    const bool done = sh_int[2] != 0;  // the same for every thread: the loop is left together
    __syncthreads();  // all read before the next pass writes them
    if (done) break;
  }
  // 2. the keys at or above the k-th: exactly k (unique keys), in no order yet
  if (threadIdx.x == 0) sh_int[1] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const unsigned long long key = s[i];
    if (key >= prefix) {
      const int at = atomicAdd(&sh_int[1], 1);
      if (at < k) sel[at] = key;  // exactly k when keys are unique; never past sel[k)
    }
  }
  __syncthreads();
  // 3. each one's place is the number of larger ones
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const unsigned long long key = sel[i];
    int r = 0;
    // not unrolled whole: with k a template constant nvcc kept all of sel[] in registers (147 at
    // k = 64, 255 at 128: no launch of 512 threads; run 20a). Now 32-34 (nvrtc_compile_check.py)
#pragma unroll 4
    for (int j = 0; j < k; ++j) r += sel[j] > key;
    s[r] = key;
  }
  __syncthreads();
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
    SHARED_EXTRA

    // 1. block keys; a thread takes whole blocks so its BK loads are independent of each other
    for (int j = threadIdx.x; j < P; j += blockDim.x) {
      unsigned long long key = 0ull;  // padding: below every real key
      if (j < G) {
        unsigned int o = 0u;
        const int t0 = j * BK;
        if (t0 + BK <= V) {
          BLOCK_MAX
        } else {
          for (int t = t0; t < V; ++t) o = max(o, graphc_order_bits(static_cast<float>(xr[t])));
        }
        key = ((unsigned long long)o << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned int)j);
      }
      s[j] = key;
    }
    __syncthreads();
    // 2. the K best blocks
    FIRST_K(P);
    if (threadIdx.x < K) top[threadIdx.x] = (int)(0xFFFFFFFFu - (unsigned int)(s[threadIdx.x] & 0xFFFFFFFFull));
    __syncthreads();
    // 3. their tokens' rank keys (consecutive threads read consecutive tokens), the K best; a
    //    token outside [0, V) is padding (never read), whatever stage 2 left in `top`
    constexpr int N = K * BK;
    for (int c = threadIdx.x; c < N; c += blockDim.x) {
      const int t = top[c / BK] * BK + (c % BK);
      s[c] = (t >= 0 && t < V) ? (((unsigned long long)graphc_order_bits(static_cast<float>(xr[t])) << 32) |
                        (unsigned long long)(0xFFFFFFFFu - (unsigned int)t))
                     : 0ull;
    }
    __syncthreads();
    FIRST_K(N);
    if (threadIdx.x < K) {
      // decode (select.decode_neg_keys), scale (one rounding), noise (noise.py's key layout)
      const unsigned long long key = s[threadIdx.x];
      const int id = (int)(0xFFFFFFFFu - (unsigned int)(key & 0xFFFFFFFFull));
      const unsigned int o = (unsigned int)(key >> 32);
      const float v = __uint_as_float((o >> 31) ? (o & 0x7FFFFFFFu) : ~o);
      const size_t at = (size_t)row * K + threadIdx.x;
      ids[at] = id;
      scaled[at] = __fmul_rn(v, inv_t[row]);
      unsigned int hh = graphc_absorb(graphc_absorb(h[row], (unsigned int)pos[row]), (unsigned int)id);
      hh ^= 12u;  // murmur finalize over the 12-byte key
      hh ^= hh >> 16; hh *= 0x85EBCA6Bu; hh ^= hh >> 13; hh *= 0xC2B2AE35u; hh ^= hh >> 16;
      const float two32 = __uint_as_float(0x2F800000u);  // 2**-32
      const float uu = __fmul_rn(__fadd_rn(__uint2float_rn(hh), 0.5f), two32);
      u[at] = fminf(fmaxf(uu, two32), __uint_as_float(0x3F7FFFFFu));  // [2**-32, 1 - 2**-24]
    }
"""

# Stage 1's max over a whole block: BK loads of one element (the first kernel), or 16-byte loads
# where the row is 16-byte aligned (BK * sizeof(T) is a multiple of 16 for every BK layout() picks).
_BLOCK_MAX_SCALAR = r"""
#pragma unroll
          for (int i = 0; i < BK; ++i) o = max(o, graphc_order_bits(static_cast<float>(xr[t0 + i])));"""
_BLOCK_MAX_VEC = r"""
          if ((reinterpret_cast<size_t>(xr) & 15) == 0) {
            constexpr int E = 16 / sizeof(T);
            const uint4* p = reinterpret_cast<const uint4*>(xr + t0);
#pragma unroll
            for (int q = 0; q < BK / E; ++q) {
              const uint4 w = p[q];
              const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
              for (int i = 0; i < E; ++i) o = max(o, graphc_order_bits(static_cast<float>(e[i])));
            }
          } else {""" + _BLOCK_MAX_SCALAR + r"""
          }"""

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
