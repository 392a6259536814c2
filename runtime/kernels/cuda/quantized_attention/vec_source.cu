
    // The grouped layout with each key's codes loaded as 8 codes a lane (one 8-byte load at 8 bits,
    // 4 bytes at 4): LPK lanes hold a key, a warp-wide load covers GPW whole keys, KPL of them a lane
    // per trip (the layout of decode_attention's vec kernel). Each lane group keeps its own online
    // softmax; the groups of a warp merge by shuffles, the warps through shared memory.
@OPEN@    for (int jw = s + warp * GPW; jw < e; jw += STRIDE * KPL) {  // warp-uniform: shuffles below
      unsigned long long kr[KPL];
      unsigned long long vr[KPL];
      float ks[KPL], kb[KPL], vs[KPL], vb[KPL];
#pragma unroll
      for (int u = 0; u < KPL; ++u) {
        const int jc = min(jw + grp + u * STRIDE, e - 1);  // past the end: a valid column, weight 0
        if (BITS == 8) {
          kr[u] = *reinterpret_cast<const unsigned long long*>(kc + (size_t)jc * RB + off * BITS / 8);
          vr[u] = *reinterpret_cast<const unsigned long long*>(vc + (size_t)jc * RB + off * BITS / 8);
        } else {
          kr[u] = *reinterpret_cast<const unsigned int*>(kc + (size_t)jc * RB + off * BITS / 8);
          vr[u] = *reinterpret_cast<const unsigned int*>(vc + (size_t)jc * RB + off * BITS / 8);
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
@MERGE@@CLOSE@
