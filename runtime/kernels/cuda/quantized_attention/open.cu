
    // Both kinds: one block per (row, KV head, query position) serving the G query heads of that KV
    // group, as decode_attention's grouped and vec kernels; keys and values are read as BITS-bit codes
    // (mx.quantize's layout: element j of a row in byte j * BITS / 8, the low nibble first at 4 bits)
    // with one scale and one bias per GS elements, and dequantized in registers: x = code * scale + bias.
    // Each kind's lane layout (its *_lanes.cu, below) places this lane: `off` is the first of the
    // dims of each key and query it holds, all in scale group off / GS; kc / vc point at the row's
    // first code.
    constexpr int RB = D * BITS / 8;  // bytes of codes per key row
    constexpr int NG = D / GS;        // scales (and biases) per key row
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
@LANES@    const size_t row0 = (size_t)(b * Hkv + kvh) * C;
    const unsigned char* kc = reinterpret_cast<const unsigned char*>(k) + row0 * RB;
    const unsigned char* vc = reinterpret_cast<const unsigned char*>(v) + row0 * RB;
    const T* ksp = k_scales + row0 * NG + off / GS;
    const T* kbp = k_biases + row0 * NG + off / GS;
    const T* vsp = v_scales + row0 * NG + off / GS;
    const T* vbp = v_biases + row0 * NG + off / GS;
    float qv[G][@N@];
    float acc[G][@N@];
    float m[G];
    float lsum[G];
    const float NEG_INF = __int_as_float(0xff800000);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const T* qp = q + ((size_t)(b * Hq + kvh * G + g) * Lq + ql) * D + off;
#pragma unroll
      for (int i = 0; i < @N@; ++i) { qv[g][i] = static_cast<float>(qp[i]) * sc; acc[g][i] = 0.f; }
      m[g] = NEG_INF;
      lsum[g] = 0.f;
    }
    const int s = start[b];
    const int e = end[0] - Lq + 1 + ql;  // causal among the Lq new columns
