
    // The grouped layout with each key's codes loaded as CPL codes a lane in one load (W words: 16
    // bytes for 16 codes at 8 bits, 8 for 8 codes at 8 bits or 16 at 4, 4 for 8 at 4): LPK lanes hold a
    // key, a warp-wide load covers GPW whole keys, KPL of them a lane per trip (the layout of
    // decode_attention's vec kernel). Each lane group keeps its own online softmax; the groups of a
    // warp merge by shuffles, the warps through shared memory.
// Code i of a lane's words as a float without an int-to-float conversion (an instruction the CUDA
// programming guide's throughput table lists at a fraction of an FP32 add's rate; a layer converts
// every code it reads): the float with bits 0x4B000000 | c is 2^23 + c exactly, and subtracting 2^23
// leaves c exactly, so the result is the conversion's, bit for bit.
#define GRAPHC_CODE(w, i) (__int_as_float((int)(0x4B000000u | (((w)[(BITS * (i)) >> 5] >> ((BITS * (i)) & 31)) & ((1u << BITS) - 1)))) - 8388608.f)
@OPEN@    for (int jw = s + warp * GPW; jw < e; jw += STRIDE * KPL) {  // warp-uniform: shuffles below
      unsigned int kr[KPL][W];
      unsigned int vr[KPL][W];
      float ks[KPL], kb[KPL], vs[KPL], vb[KPL];
#pragma unroll
      for (int u = 0; u < KPL; ++u) {
        const int jc = min(jw + grp + u * STRIDE, e - 1);  // past the end: a valid column, weight 0
        const unsigned char* kq = kc + (size_t)jc * RB + off * BITS / 8;
        const unsigned char* vq = vc + (size_t)jc * RB + off * BITS / 8;
        if (W == 4) {  // (`% W` keeps the branches W does not take in bounds: they are compiled, never run)
          const uint4 a = *reinterpret_cast<const uint4*>(kq);
          const uint4 c = *reinterpret_cast<const uint4*>(vq);
          kr[u][0] = a.x; kr[u][1 % W] = a.y; kr[u][2 % W] = a.z; kr[u][3 % W] = a.w;
          vr[u][0] = c.x; vr[u][1 % W] = c.y; vr[u][2 % W] = c.z; vr[u][3 % W] = c.w;
        } else if (W == 2) {
          const uint2 a = *reinterpret_cast<const uint2*>(kq);
          const uint2 c = *reinterpret_cast<const uint2*>(vq);
          kr[u][0] = a.x; kr[u][1 % W] = a.y;
          vr[u][0] = c.x; vr[u][1 % W] = c.y;
        } else {
          kr[u][0] = *reinterpret_cast<const unsigned int*>(kq);
          vr[u][0] = *reinterpret_cast<const unsigned int*>(vq);
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
          const float x = GRAPHC_CODE(kr[u], i) * ks[u] + kb[u];
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
          const float x = GRAPHC_CODE(vr[u], i) * vs[u] + vb[u];
#pragma unroll
          for (int g = 0; g < G; ++g) acc[g][i] += p[g][u] * x;
        }
    }
@MERGE@@CLOSE@
