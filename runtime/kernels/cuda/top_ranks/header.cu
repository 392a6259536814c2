
__device__ __forceinline__ unsigned int graphc_order_bits(float f) {
  // ranks._order_keys: -0.0 as +0.0; IEEE order -> unsigned order
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
    // k = 64, 255 at 128: no launch of 512 threads). Now 32-34 (benchmarks/kernel_builds.py)
#pragma unroll 4
    for (int j = 0; j < k; ++j) r += sel[j] > key;
    s[r] = key;
  }
  __syncthreads();
}
