
          if ((reinterpret_cast<size_t>(xr) & 15) == 0) {
            constexpr int E = 16 / sizeof(T);
            const uint4* p = reinterpret_cast<const uint4*>(xr + t0);
#pragma unroll
            for (int q = 0; q < BK / E; ++q) {
              const uint4 w = p[q];
              const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
              for (int i = 0; i < E; ++i) o = max(o, graphc_order_bits(static_cast<float>(e[i])));
            }
          } else {@SCALAR@
          }