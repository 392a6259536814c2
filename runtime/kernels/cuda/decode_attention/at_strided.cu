#define GRAPHC_START(b) start[(size_t)(b) * start_strides[0]]
    {
      const int Hkv_ = k_shape[1], C_ = k_shape[2], Hq_ = q_shape[1], Lq_ = q_shape[2];
      const bool rows = nk_strides[3] == 1 && nv_strides[3] == 1;
      const bool query = q_strides[3] == 1 && (q_strides[2] == D || Lq_ == 1) && (q_strides[1] == (long)Lq_ * D || Hq_ == 1)
          && (q_strides[0] == (long)Hq_ * Lq_ * D || q_shape[0] == 1);
      const bool buffers = k_strides[3] == 1 && k_strides[2] == D && (k_strides[1] == (long)C_ * D || Hkv_ == 1)
          && (k_strides[0] == (long)Hkv_ * C_ * D || k_shape[0] == 1) && v_strides[3] == 1 && v_strides[2] == D
          && (v_strides[1] == (long)C_ * D || Hkv_ == 1) && (v_strides[0] == (long)Hkv_ * C_ * D || k_shape[0] == 1);
      if (!rows || !query || !buffers) __trap();  // the loads and stores below would miss: never a silent misread
    }
