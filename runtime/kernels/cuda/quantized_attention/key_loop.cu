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
