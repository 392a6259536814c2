
    // One block per (row, KV head, query position) serving the G query heads of that KV group, as the
    // grouped kernel of decode_attention; keys and values are read as BITS-bit codes (mx.quantize's
    // layout: element j of a row in byte j * BITS / 8, the low nibble first at 4 bits) with one scale
    // and one bias per GS elements, and dequantized in registers: x = code * scale + bias.
    constexpr int KPI = 4;
    constexpr int PER = D / 32;
    constexpr int RB = D * BITS / 8;  // bytes of codes per key row
    constexpr int NG = D / GS;        // scales (and biases) per key row
    const int Hq = q_shape[1];
    const int Lq = q_shape[2];
    const int Hkv = k_shape[1];
    const int C = k_shape[2];
    int blk = blockIdx.x;  // (b, kvh, l)
    const int ql = blk % Lq;
    blk /= Lq;
    const int kvh = blk % Hkv;
    const int b = blk / Hkv;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const float sc = scale[0];
    const int off = lane * PER;  // this lane's PER dims of every key, all in scale group off / GS
    const size_t row0 = (size_t)(b * Hkv + kvh) * C;
    const unsigned char* kc = reinterpret_cast<const unsigned char*>(k) + row0 * RB;
    const unsigned char* vc = reinterpret_cast<const unsigned char*>(v) + row0 * RB;
    const T* ksp = k_scales + row0 * NG + off / GS;
    const T* kbp = k_biases + row0 * NG + off / GS;
    const T* vsp = v_scales + row0 * NG + off / GS;
    const T* vbp = v_biases + row0 * NG + off / GS;
    float qv[G][PER];
    float acc[G][PER];
    float m[G];
    float lsum[G];
    const float NEG_INF = __int_as_float(0xff800000);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const T* qp = q + ((size_t)(b * Hq + kvh * G + g) * Lq + ql) * D + off;
#pragma unroll
      for (int i = 0; i < PER; ++i) { qv[g][i] = static_cast<float>(qp[i]) * sc; acc[g][i] = 0.f; }
      m[g] = NEG_INF;
      lsum[g] = 0.f;
    }
    const int s = start[b];
    const int e = end[0] - Lq + 1 + ql;  // causal among the Lq new columns
    for (int j0 = s + warp * KPI; j0 < e; j0 += WARPS * KPI) {
      float kk[KPI][PER];
      float vv[KPI][PER];
#pragma unroll
      for (int u = 0; u < KPI; ++u) {
        const int jc = min(j0 + u, e - 1);  // past the end: a valid column, weight 0
        const float ks = static_cast<float>(ksp[(size_t)jc * NG]), kb = static_cast<float>(kbp[(size_t)jc * NG]);
        const float vs = static_cast<float>(vsp[(size_t)jc * NG]), vb = static_cast<float>(vbp[(size_t)jc * NG]);
        const unsigned char* kr = kc + (size_t)jc * RB;
        const unsigned char* vr = vc + (size_t)jc * RB;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
          const int j = off + i;
          const int kq = BITS == 8 ? kr[j] : (kr[j >> 1] >> ((j & 1) * 4)) & 0xF;
          const int vq = BITS == 8 ? vr[j] : (vr[j >> 1] >> ((j & 1) * 4)) & 0xF;
          kk[u][i] = kq * ks + kb;
          vv[u][i] = vq * vs + vb;
        }
      }
      float d[G][KPI];
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int u = 0; u < KPI; ++u) {
          float t = 0.f;
#pragma unroll
          for (int i = 0; i < PER; ++i) t += qv[g][i] * kk[u][i];
          d[g][u] = t;
        }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int u = 0; u < KPI; ++u) d[g][u] += __shfl_xor_sync(0xffffffff, d[g][u], o);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float mn = m[g];
#pragma unroll
        for (int u = 0; u < KPI; ++u) {
          if (j0 + u >= e) d[g][u] = NEG_INF;
          mn = fmaxf(mn, d[g][u]);
        }
        const float c = expf(m[g] - mn);  // m = -inf on the first keys: c = 0; mn is finite (j0 < e)
        lsum[g] *= c;
#pragma unroll
        for (int i = 0; i < PER; ++i) acc[g][i] *= c;
#pragma unroll
        for (int u = 0; u < KPI; ++u) {
          const float p = expf(d[g][u] - mn);
          lsum[g] += p;
#pragma unroll
          for (int i = 0; i < PER; ++i) acc[g][i] += p * vv[u][i];
        }
        m[g] = mn;
      }
    }
@CLOSE@
