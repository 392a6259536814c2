
    // One lane per 8 consecutive values of one new key or value row: LPR = D / 8 lanes a row, so a
    // warp holds whole rows and a scale group is GS / 8 aligned lanes of one. Each group is quantized
    // as MLX's CUDA affine_quantize does it (mlx/backend/cuda/quantized/affine_quantize.cu, MLX 0.32),
    // op for op, so codes, scales and biases are mx.quantize's bit for bit: the same float math, the
    // same start values of min and max, round() (halves away from zero), the same casts.
    constexpr int LPG = GS / 8;    // lanes a scale group
    constexpr int WPL = BITS / 4;  // uint32 code words a lane writes: 8 codes of BITS bits
    constexpr float N_BINS = (1 << BITS) - 1;
    const int B = nk_shape[0], Hkv = nk_shape[1], Lq = nk_shape[2], D = nk_shape[3];
    const int C = k_shape[2];
    const int LPR = D / 8;
    const long W = D * BITS / 32;  // code words a row
    const long NG = D / GS;        // scales (and biases) a row
    {
      // The planes are written in place, so they must be the row-contiguous arrays the cache keeps
      // (a copy would take the write), and the new rows' last dim contiguous (read 8 at a time).
      // (Each `<name>_strides` spelled out: MLX passes an input's strides where the source names them.)
      auto dense = [&](const auto& s, long n) {
        return s[3] == 1 && s[2] == n && (s[1] == C * n || Hkv == 1) && (s[0] == Hkv * C * n || B == 1);
      };
      const bool ok = nk_strides[3] == 1 && nv_strides[3] == 1 && dense(k_strides, W) && dense(v_strides, W)
          && dense(k_scales_strides, NG) && dense(k_biases_strides, NG) && dense(v_scales_strides, NG)
          && dense(v_biases_strides, NG);
      if (!ok) __trap();  // the stores below would miss: never a silent miswrite
    }
    const long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const int items = B * Hkv * Lq * 2;  // (row, KV head, query position, key or value)
    int item = (int)(t / LPR);
    const bool live = item < items;
    if (!live) item = items - 1;  // the shuffles need every lane: lanes past the last row redo it, writing nothing
    const int sub = (int)(t % LPR);
    const int kv = item & 1;
    int r = item >> 1;
    const int l = r % Lq;
    r /= Lq;
    const int h = r % Hkv;
    const int b = r / Hkv;
    const T* src = kv ? nv + b * nv_strides[0] + h * nv_strides[1] + l * nv_strides[2]
                      : nk + b * nk_strides[0] + h * nk_strides[1] + l * nk_strides[2];
    src += sub * 8;
    float w[8];
    // MLX's start values: min from the largest float, max from 0 (so a group of only negative values
    // has max 0 in MLX's CUDA quantize, unlike its CPU one, which starts from -inf).
    float lo = __int_as_float(0x7f7fffff), hi = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      w[i] = static_cast<float>(src[i]);
      lo = fminf(lo, w[i]);
      hi = fmaxf(hi, w[i]);
    }
#pragma unroll
    for (int o = LPG / 2; o > 0; o >>= 1) {  // min and max are exact: any order gives MLX's
      lo = fminf(lo, __shfl_xor_sync(0xffffffff, lo, o));
      hi = fmaxf(hi, __shfl_xor_sync(0xffffffff, hi, o));
    }
    float scale = fmaxf((hi - lo) / N_BINS, 1e-7f);
    const bool side = fabsf(lo) > fabsf(hi);
    scale = side ? scale : -scale;
    const float edge = side ? lo : hi;
    const float q0 = roundf(edge / scale);
    const bool at_zero = q0 == 0.0f;
    scale = at_zero ? scale : edge / q0;
    const float bias = at_zero ? 0.f : edge;
    uint32_t words[WPL];
#pragma unroll
    for (int j = 0; j < WPL; ++j) words[j] = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      // MLX: uint8_t(min(round((w - bias) / scale), n_bins)); the quotient is never below -0.5, so the
      // max with 0 only keeps the conversion defined
      const float c = fmaxf(fminf(roundf((w[i] - bias) / scale), N_BINS), 0.f);
      words[i * BITS / 32] |= static_cast<uint32_t>(c) << ((i * BITS) % 32);
    }
    if (live) {
      const long row = (long)(b * Hkv + h) * C + col[0] + l;
      uint32_t* cw = const_cast<uint32_t*>(kv ? v : k) + row * W + sub * WPL;
#pragma unroll
      for (int j = 0; j < WPL; ++j) cw[j] = words[j];
      if (sub % LPG == 0) {  // the group's first lane writes its scale and bias
        const long g = row * NG + sub / LPG;
        const_cast<T*>(kv ? v_scales : k_scales)[g] = static_cast<T>(scale);
        const_cast<T*>(kv ? v_biases : k_biases)[g] = static_cast<T>(bias);
      }
    }
    if (t == 0) end[0] = col[0] + Lq;  // the attention's end: taking it orders that launch after this one
