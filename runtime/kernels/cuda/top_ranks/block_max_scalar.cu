
#pragma unroll
          for (int i = 0; i < BK; ++i) o = max(o, graphc_order_bits(static_cast<float>(xr[t0 + i])));