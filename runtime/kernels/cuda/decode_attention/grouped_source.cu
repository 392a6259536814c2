
@OPEN@@KEYS@      float d[G][KPI];
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int u = 0; u < KPI; ++u) {
          float t = 0.f;
#pragma unroll
          for (int i = 0; i < PER; ++i) t += qv[g][i] * static_cast<float>(kk[u][i]);
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
          for (int i = 0; i < PER; ++i) acc[g][i] += p * static_cast<float>(vv[u][i]);
        }
        m[g] = mn;
      }
    }
@CLOSE@