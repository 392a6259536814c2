
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
      // decode (ranks.decode_neg_keys), scale (one rounding), noise (noise.py's key layout)
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
