
template <int K>
__device__ __forceinline__ void graphc_mlx_cumsum(float* c) {
  static_assert(K >= 4 && K <= 256, "at most two scanning warps");
  constexpr int NT = ((K / 4 + 31) / 32) * 32;
  __shared__ float warp_sums[2];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  float v[4];
  float prev = 0.0f;
  if (t < NT) {  // whole warps: every lane of a scanning warp takes the shuffles
    for (int j = 0; j < 4; ++j) v[j] = (t * 4 + j < K) ? c[t * 4 + j] : 0.0f;
    for (int j = 1; j < 4; ++j) v[j] = v[j] + v[j - 1];
    float incl = v[3];
    for (int m = 1; m < 32; m <<= 1) {
      const float up = __shfl_up_sync(0xffffffffu, incl, m);
      if (m <= lane) incl = incl + up;
    }
    prev = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) prev = 0.0f;
    if (lane == 31) warp_sums[warp] = prev + v[3];
  }
  __syncthreads();  // every read of c is done, and the warp totals are in
  if (t < NT) {
    const float before = warp == 0 ? 0.0f : warp_sums[0];
    for (int j = 0; j < 4; ++j) {
      v[j] = v[j] + 0.0f;  // MLX's running prefix of earlier block passes: 0 in its only pass
      v[j] = v[j] + before;
      v[j] = v[j] + prev;
      if (t * 4 + j < K) c[t * 4 + j] = v[j];
    }
  }
  __syncthreads();
}

// choose.top_p_sums into c [K] (shared): where(rank < kk, exp(s_r - s_0), 0) (no mask without
// top-k: MASK false), then MLX's scan. Thread i < K is rank i; called by every thread of the block.
template <int K, bool MASK>
__device__ __forceinline__ void graphc_top_p_sums(float* c, float sv, float s0, int kk) {
  const int i = threadIdx.x;
  if (i < K) c[i] = (!MASK || i < kk) ? expf(sv - s0) : 0.0f;
  __syncthreads();
  graphc_mlx_cumsum<K>(c);
}
