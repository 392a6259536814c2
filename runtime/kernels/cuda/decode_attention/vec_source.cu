
    constexpr int VEC = 16 / sizeof(T);  // elements per 16-byte load
    constexpr int LPK = D / VEC;           // lanes per key
    constexpr int GPW = 32 / LPK;          // keys one warp-wide load covers
    constexpr int STRIDE = WARPS * GPW;    // keys one block-wide load covers
@OPEN@    // 16-byte loads need 16-byte addresses; a view at an odd offset takes the element loads.
    const bool aligned = ((reinterpret_cast<unsigned long long>(kp) | reinterpret_cast<unsigned long long>(vp)@NEWPTRS@) & 15) == 0
                         @NEWALIGN@;
    for (int jw = s + warp * GPW; jw < e; jw += STRIDE * KPL) {  // warp-uniform: shuffles below
      uint4 kr[KPL];
      uint4 vr[KPL];
#pragma unroll
      for (int u = 0; u < KPL; ++u) {
        const int jc = min(jw + grp + u * STRIDE, e - 1);  // past the end: a valid column, weight 0
@ROWS@        if (aligned) {
          kr[u] = *reinterpret_cast<const uint4*>(ks);
          vr[u] = *reinterpret_cast<const uint4*>(vs);
        } else {
          T* kt = reinterpret_cast<T*>(&kr[u]);
          T* vt = reinterpret_cast<T*>(&vr[u]);
#pragma unroll
          for (int i = 0; i < VEC; ++i) { kt[i] = ks[i]; vt[i] = vs[i]; }
        }
      }
      float d[G][KPL];
#pragma unroll
      for (int u = 0; u < KPL; ++u) {
        const T* ke = reinterpret_cast<const T*>(&kr[u]);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float t = 0.f;
#pragma unroll
          for (int i = 0; i < VEC; ++i) t += qv[g][i] * static_cast<float>(ke[i]);
          d[g][u] = t;
        }
      }
#pragma unroll
      for (int o = LPK / 2; o > 0; o >>= 1)  // sum over the LPK lanes of each key
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
          for (int u = 0; u < KPL; ++u) d[g][u] += __shfl_xor_sync(0xffffffff, d[g][u], o);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float mn = m[g];
#pragma unroll
        for (int u = 0; u < KPL; ++u) {
          if (jw + grp + u * STRIDE >= e) d[g][u] = NEG_INF;
          mn = fmaxf(mn, d[g][u]);
        }
        if (mn == NEG_INF) continue;  // this lane group has had no valid key yet
        const float c = expf(m[g] - mn);  // m = -inf on a group's first keys: c = 0
        lsum[g] *= c;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] *= c;
#pragma unroll
        for (int u = 0; u < KPL; ++u) {
          const float p = expf(d[g][u] - mn);
          const T* ve = reinterpret_cast<const T*>(&vr[u]);
          lsum[g] += p;
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[g][i] += p * static_cast<float>(ve[i]);
        }
        m[g] = mn;
      }
    }
@MERGE@@CLOSE@