
    // One block per (row, query head, query position); WARPS warps each take KPI consecutive keys per
    // iteration. All KPI keys' K and V loads are issued before any of them is used, so an
    // iteration waits for one memory round trip, not 2 x KPI of them (a decode step at
    // batch 64 runs thousands of these blocks, each latency-bound).
    constexpr int WARPS = 4;
@SHAPES@    const int bhl = blockIdx.x;  // q and out are [B, Hq, Lq, D] contiguous
    const int bh = bhl / Lq;
    const int b = bh / Hq;
    const int h = bh % Hq;
    const int kvh = h / (Hq / Hkv);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const float sc = scale[0];

    const T* qp = q + (size_t)bhl * D + lane * PER;
    const T* kp = k + (size_t)(b * Hkv + kvh) * C * D + lane * PER;
    const T* vp = v + (size_t)(b * Hkv + kvh) * C * D + lane * PER;

    float qv[PER];
    float acc[PER];
    for (int i = 0; i < PER; ++i) { qv[i] = static_cast<float>(qp[i]) * sc; acc[i] = 0.f; }
    const float NEG_INF = __int_as_float(0xff800000);
    float m = NEG_INF;
    float l = 0.f;
    const int s = GRAPHC_START(b);
    const int e = end[0] - Lq + 1 + (bhl % Lq);  // causal among the Lq new columns
@NEW@@KEYS@      float d[KPI];
#pragma unroll
      for (int u = 0; u < KPI; ++u) {
        d[u] = 0.f;
#pragma unroll
        for (int i = 0; i < PER; ++i) d[u] += qv[i] * static_cast<float>(kk[u][i]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int u = 0; u < KPI; ++u) d[u] += __shfl_xor_sync(0xffffffff, d[u], o);
      float mn = m;
#pragma unroll
      for (int u = 0; u < KPI; ++u) {
        if (j0 + u >= e) d[u] = NEG_INF;
        mn = fmaxf(mn, d[u]);
      }
      const float c = expf(m - mn);  // m = -inf on the first keys: c = 0; mn is finite (j0 < e)
      l *= c;
#pragma unroll
      for (int i = 0; i < PER; ++i) acc[i] *= c;
#pragma unroll
      for (int u = 0; u < KPI; ++u) {
        const float p = expf(d[u] - mn);
        l += p;
#pragma unroll
        for (int i = 0; i < PER; ++i) acc[i] += p * static_cast<float>(vv[u][i]);
      }
      m = mn;
    }
    __shared__ float sm[WARPS];
    __shared__ float sl[WARPS];
    __shared__ float sacc[WARPS][D];
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
    for (int i = 0; i < PER; ++i) sacc[warp][lane * PER + i] = acc[i];
    __syncthreads();
    if (warp == 0) {
        float M = NEG_INF;
        for (int w = 0; w < WARPS; ++w) M = fmaxf(M, sm[w]);
        float L = 0.f;
        float f[WARPS];
        for (int w = 0; w < WARPS; ++w) { f[w] = (sl[w] > 0.f) ? expf(sm[w] - M) : 0.f; L += sl[w] * f[w]; }
        for (int i = 0; i < PER; ++i) {
            float o = 0.f;
            for (int w = 0; w < WARPS; ++w) o += sacc[w][lane * PER + i] * f[w];
            out[(size_t)bhl * D + lane * PER + i] = static_cast<T>(o / L);
        }
    }
