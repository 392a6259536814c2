
__device__ __forceinline__ uint4 graphc_ld_stream(const void* p) {
  uint4 r;  // weights: read once, keep them out of L1
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint4 graphc_ld_keep(const void* p) {
  uint4 r;  // activations: every warp reads them, let L1 keep them
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
template <bool BF16>
__device__ __forceinline__ void graphc_mma(float* d, unsigned a0, unsigned a1, unsigned a2,
                                           unsigned a3, unsigned b0, unsigned b1) {
  if constexpr (BF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}
// One 32-wide k chunk: thread (g = lane / 4, t = lane % 4) holds k [8t, 8t + 8) of w rows
// g and g + 8 of each 16-row tile and of x row g of each 8-row tile. mma 1 takes k
// 8t..8t+3 as the fragment's (2t, 2t+1, 2t+8, 2t+9), mma 2 takes 8t+4..8t+7.
template <bool BF16, int RT, int MT>
__device__ __forceinline__ void graphc_chunk(float (&acc)[RT][MT][4], const uint4 (&wv)[RT][2],
                                             const char* const (&xp)[MT], int off) {
  uint4 xv[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) xv[j] = graphc_ld_keep(xp[j] + off);
#pragma unroll
  for (int r = 0; r < RT; ++r) {
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      graphc_mma<BF16>(acc[r][j], wv[r][0].x, wv[r][1].x, wv[r][0].y, wv[r][1].y, xv[j].x, xv[j].y);
      graphc_mma<BF16>(acc[r][j], wv[r][0].z, wv[r][1].z, wv[r][0].w, wv[r][1].w, xv[j].z, xv[j].w);
    }
  }
}
