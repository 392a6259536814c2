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
