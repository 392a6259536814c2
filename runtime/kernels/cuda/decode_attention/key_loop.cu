    for (int j0 = s + warp * KPI; j0 < e; j0 += WARPS * KPI) {
      T kk[KPI][PER];
      T vv[KPI][PER];
#pragma unroll
      for (int u = 0; u < KPI; ++u) {
        const int jc = min(j0 + u, e - 1);  // past the end: a valid column, weight 0
@ROWS@#pragma unroll
        for (int i = 0; i < PER; ++i) { kk[u][i] = ks[i]; vv[u][i] = vs[i]; }
      }
