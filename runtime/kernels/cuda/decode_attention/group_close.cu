    __shared__ float sm[WARPS][G];
    __shared__ float sl[WARPS][G];
    __shared__ float sacc[WARPS][G][D];
    if (@WRITER@) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (lane == 0) { sm[warp][g] = m[g]; sl[warp][g] = lsum[g]; }
#pragma unroll
        for (int i = 0; i < @N@; ++i) sacc[warp][g][off + i] = acc[g][i];
      }
    }
    __syncthreads();
    for (int g = warp; g < G; g += WARPS) {
      float M = NEG_INF;
      for (int w = 0; w < WARPS; ++w) M = fmaxf(M, sm[w][g]);
      float L = 0.f;
      float f[WARPS];
      for (int w = 0; w < WARPS; ++w) { f[w] = (sl[w][g] > 0.f) ? expf(sm[w][g] - M) : 0.f; L += sl[w][g] * f[w]; }
      const size_t bhl = (size_t)(b * Hq + kvh * G + g) * Lq + ql;
      for (int i = lane; i < D; i += 32) {
        float o = 0.f;
        for (int w = 0; w < WARPS; ++w) o += sacc[w][g][i] * f[w];
        out[bhl * D + i] = static_cast<T>(o / L);
      }
    }
