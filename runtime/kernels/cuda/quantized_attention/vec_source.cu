
    // The grouped layout with each key's codes loaded as 8 codes a lane (one 8-byte load at 8 bits,
    // 4 bytes at 4): LPK lanes hold a key, a warp-wide load covers GPW whole keys, KPL of them a lane
    // per trip (the layout of decode_attention's vec kernel). Each lane group keeps its own online
    // softmax; the groups of a warp merge by shuffles, the warps through shared memory.
    constexpr int VEC = 8;              // codes of a key one lane holds
    constexpr int LPK = D / VEC;        // lanes per key
    constexpr int GPW = 32 / LPK;       // keys one warp-wide load covers
    constexpr int STRIDE = WARPS * GPW; // keys one block-wide load covers
    constexpr int RB = D * BITS / 8;    // bytes of codes per key row
    constexpr int NG = D / GS;          // scales (and biases) per key row
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
    const int sub = lane % LPK;  // this lane's VEC dims of a key: off .. off + VEC, in one scale group
    const int grp = lane / LPK;  // which of the warp's GPW keys
    const int off = sub * VEC;
    const size_t row0 = (size_t)(b * Hkv + kvh) * C;
    const unsigned char* kc = reinterpret_cast<const unsigned char*>(k) + row0 * RB + off * BITS / 8;
    const unsigned char* vc = reinterpret_cast<const unsigned char*>(v) + row0 * RB + off * BITS / 8;
    const T* ksp = k_scales + row0 * NG + off / GS;
    const T* kbp = k_biases + row0 * NG + off / GS;
    const T* vsp = v_scales + row0 * NG + off / GS;
    const T* vbp = v_biases + row0 * NG + off / GS;
    float qv[G][VEC];
    float acc[G][VEC];
    float m[G];
    float lsum[G];
    const float NEG_INF = __int_as_float(0xff800000);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const T* qp = q + ((size_t)(b * Hq + kvh * G + g) * Lq + ql) * D + off;
#pragma unroll
      for (int i = 0; i < VEC; ++i) { qv[g][i] = static_cast<float>(qp[i]) * sc; acc[g][i] = 0.f; }
      m[g] = NEG_INF;
      lsum[g] = 0.f;
    }
    const int s = start[b];
    const int e = end[0] - Lq + 1 + ql;  // causal among the Lq new columns
    for (int jw = s + warp * GPW; jw < e; jw += STRIDE * KPL) {  // warp-uniform: shuffles below
      unsigned long long kr[KPL];
      unsigned long long vr[KPL];
      float ks[KPL], kb[KPL], vs[KPL], vb[KPL];
#pragma unroll
      for (int u = 0; u < KPL; ++u) {
        const int jc = min(jw + grp + u * STRIDE, e - 1);  // past the end: a valid column, weight 0
        if (BITS == 8) {
          kr[u] = *reinterpret_cast<const unsigned long long*>(kc + (size_t)jc * RB);
          vr[u] = *reinterpret_cast<const unsigned long long*>(vc + (size_t)jc * RB);
        } else {
          kr[u] = *reinterpret_cast<const unsigned int*>(kc + (size_t)jc * RB);
          vr[u] = *reinterpret_cast<const unsigned int*>(vc + (size_t)jc * RB);
        }
        ks[u] = static_cast<float>(ksp[(size_t)jc * NG]);
        kb[u] = static_cast<float>(kbp[(size_t)jc * NG]);
        vs[u] = static_cast<float>(vsp[(size_t)jc * NG]);
        vb[u] = static_cast<float>(vbp[(size_t)jc * NG]);
      }
      float d[G][KPL];
#pragma unroll
      for (int u = 0; u < KPL; ++u) {
#pragma unroll
        for (int g = 0; g < G; ++g) d[g][u] = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float x = static_cast<float>((kr[u] >> (BITS * i)) & ((1u << BITS) - 1)) * ks[u] + kb[u];
#pragma unroll
          for (int g = 0; g < G; ++g) d[g][u] += qv[g][i] * x;
        }
      }
#pragma unroll
      for (int o = LPK / 2; o > 0; o >>= 1)  // sum over the LPK lanes of each key
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int u = 0; u < KPL; ++u) d[g][u] += __shfl_xor_sync(0xffffffff, d[g][u], o);
      float p[G][KPL];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float mn = m[g];
#pragma unroll
        for (int u = 0; u < KPL; ++u) {
          if (jw + grp + u * STRIDE >= e) d[g][u] = NEG_INF;
          mn = fmaxf(mn, d[g][u]);
        }
        if (mn == NEG_INF) {  // this lane group has had no valid key yet
#pragma unroll
          for (int u = 0; u < KPL; ++u) p[g][u] = 0.f;
          continue;
        }
        const float c = expf(m[g] - mn);  // m = -inf on a group's first keys: c = 0
        lsum[g] *= c;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] *= c;
#pragma unroll
        for (int u = 0; u < KPL; ++u) {
          p[g][u] = expf(d[g][u] - mn);
          lsum[g] += p[g][u];
        }
        m[g] = mn;
      }
#pragma unroll
      for (int u = 0; u < KPL; ++u)
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float x = static_cast<float>((vr[u] >> (BITS * i)) & ((1u << BITS) - 1)) * vs[u] + vb[u];
#pragma unroll
          for (int g = 0; g < G; ++g) acc[g][i] += p[g][u] * x;
        }
    }
    // Merge the warp's GPW lane groups (lanes LPK apart hold the same dims).
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float mo = __shfl_xor_sync(0xffffffff, m[g], o);
        const float lo = __shfl_xor_sync(0xffffffff, lsum[g], o);
        const float M = fmaxf(m[g], mo);
        const float fs = (m[g] == NEG_INF) ? 0.f : expf(m[g] - M);
        const float fo = (mo == NEG_INF) ? 0.f : expf(mo - M);
        lsum[g] = lsum[g] * fs + lo * fo;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float ao = __shfl_xor_sync(0xffffffff, acc[g][i], o);
          acc[g][i] = acc[g][i] * fs + ao * fo;
        }
        m[g] = M;
      }
    }
@CLOSE@
