
    // One block per row, max(K, 32) threads: thread i < K is rank i (K: the candidate width, a
    // power of two <= 256); the scan needs whole warps.
    const int row = blockIdx.x;
    const int i = threadIdx.x;
    const bool rank = i < K;
    const size_t base = (size_t)row * K;
    const float s0 = s[base];
    const float sv = rank ? s[base + i] : s0;
    const int kk = min(top_k[row], K);  // choose.rank_masks: rank < min(top_k, K); the last kept rank kk - 1
    bool keep = rank;
    if (USE_TOP_K) keep = keep && i < kk;
    if (USE_TOP_P) {
      __shared__ float c[K];
      graphc_top_p_sums<K, USE_TOP_K>(c, sv, s0, kk);
      const float tp = top_p[row];
      const float excl = (i == 0 || !rank) ? 0.0f : c[i - 1];
      keep = keep && ((excl < tp * c[kk - 1]) || (tp >= 1.0f));
    }
    if (USE_MIN_P) keep = keep && ((sv - s0) >= log_min_p[row]);
    __shared__ float best[K];
    __shared__ int at[K];
    if (rank) {
      const float g = -logf(-logf(u[base + i]));  // noise.gumbel_from_uniform (libdevice's logf, as MLX's Log)
      best[i] = keep ? sv + g : __uint_as_float(0xFF800000u);  // -inf
      at[i] = i;
    }
    __syncthreads();
    // argmax as MLX's: the larger value, or on a tie the lower rank
    for (int w = K / 2; w > 0; w >>= 1) {
      if (i < w) {
        const float a = best[i], b = best[i + w];
        if (a < b || (a == b && at[i + w] < at[i])) { best[i] = b; at[i] = at[i + w]; }
      }
      __syncthreads();
    }
    if (i == 0) token[row] = ids[base + at[0]];
