    const int e0 = end[0] - Lq;  // this step's new columns e0 .. e0 + Lq - 1: read from nk / nv ...
    const T* nk0 = nk + (size_t)b * nk_strides[0] + (size_t)kvh * nk_strides[1];
    const T* nv0 = nv + (size_t)b * nv_strides[0] + (size_t)kvh * nv_strides[1];
    const int nkj = nk_strides[2];  // one new column to the next (32 bits: registers are what limit the vec kernel)
    const int nvj = nv_strides[2];
    const T* nkp = nk0 + @OFF@;
    const T* nvp = nv0 + @OFF@;
    if (@WRITES@) {  // ... and written into the cache, each by one block
      T* kw = const_cast<T*>(k) + ((size_t)(b * Hkv + kvh) * C + e0 + @QL@) * D;
      T* vw = const_cast<T*>(v) + ((size_t)(b * Hkv + kvh) * C + e0 + @QL@) * D;
      const T* ksrc = nk0 + (size_t)@QL@ * nkj;
      const T* vsrc = nv0 + (size_t)@QL@ * nvj;
      for (int i = threadIdx.x; i < D; i += blockDim.x) {
        kw[i] = ksrc[i];
        vw[i] = vsrc[i];
      }
    }
