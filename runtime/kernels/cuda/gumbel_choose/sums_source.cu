
    const int row = blockIdx.x;
    const int i = threadIdx.x;
    const size_t base = (size_t)row * K;
    const float s0 = s[base];
    __shared__ float c[K];
    graphc_top_p_sums<K, MASK>(c, i < K ? s[base + i] : s0, s0, min(top_k[row], K));
    if (i < K) sums[base + i] = c[i];
