"""What one doubling of the prefix pool costs (runtime/cache/pool.py: `mx.pad` of every layer's K
and V to twice the rows), at a model's per-token KV shape, on the device.

A pool that doubles during a call adds that time to the call (proto_step_outliers.py prints when
it grew). Usage: proto_pool_growth.py [LAYERS] [KV_HEADS] [HEAD_DIM] [ROWS...]
  e.g. proto_pool_growth.py 32 8 128 16384 32768 65536   (Llama-3.1-8B)"""
import sys
import time

import mlx.core as mx
import numpy as np

from graphc.runtime.cache.pool import KVPool

layers, heads, dim = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (32, 8, 128)
sizes = [int(x) for x in sys.argv[4:]] or [16384, 32768, 65536]
for rows in sizes:
    pool = KVPool(list(range(layers)), capacity=4 * rows)
    plane = mx.zeros((heads, 1, dim), mx.bfloat16)
    for layer in range(layers):  # fill to `rows` rows, then one write past them doubles every layer
        pool.write(layer, np.array([rows - 1]), (plane, plane))
    mx.eval(pool.arrays())
    mx.synchronize()
    before = pool.nbytes
    t0 = time.perf_counter()
    pool.write(0, np.array([rows]), (plane, plane))
    t1 = time.perf_counter()
    mx.eval(pool.arrays())
    mx.synchronize()
    t2 = time.perf_counter()
    print(f"{layers} layers x {heads} x {dim}: {rows} -> {pool.rows} rows ({before / 2**30:.2f} -> "
          f"{pool.nbytes / 2**30:.2f} GiB): host {1e3 * (t1 - t0):.1f} ms, until done {1e3 * (t2 - t0):.1f} ms",
          flush=True)
    del pool
    mx.clear_cache()
