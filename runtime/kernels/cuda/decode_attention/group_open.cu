    int blk = blockIdx.x;  // (b, kvh, l)
    const int ql = blk % Lq;
    blk /= Lq;
    const int kvh = blk % Hkv;
    const int b = blk / Hkv;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const float sc = scale[0];
@LANES@
    const T* kp = k + (size_t)(b * Hkv + kvh) * C * D + off;
    const T* vp = v + (size_t)(b * Hkv + kvh) * C * D + off;
    float qv[G][@N@];
    float acc[G][@N@];
    float m[G];
    float lsum[G];
    const float NEG_INF = __int_as_float(0xff800000);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const T* qp = q + ((size_t)(b * Hq + kvh * G + g) * Lq + ql) * D + off;
#pragma unroll
      for (int i = 0; i < @N@; ++i) { qv[g][i] = static_cast<float>(qp[i]) * sc; acc[g][i] = 0.f; }
      m[g] = NEG_INF;
      lsum[g] = 0.f;
    }
    const int s = GRAPHC_START(b);
    const int e = end[0] - Lq + 1 + ql;  // causal among the Lq new columns
@NEW@