"""One decode step's K/V column writes at an array index, inside mx.compile, four ways: which costs
least on the device (run 20's ncu: the step's 64 `scatter_axis` launches, K and V of 32 layers, are
~0.94 ms of an 8B batch-64 compiled step, ~15 µs each for 128 KB).

  two scatters     what compiled_decode._write_columns does: put_along_axis into K, then into V
  one scatter      K and V in one [2, B, H, C, D] buffer per layer, written by one put_along_axis
                   (the attention would read its [0] and [1]: contiguous views, no copy)
  flat scatter     the same two writes on [B * H, C, D] views (fewer index dimensions)
  setitem          MLX's general scatter (`buf[:, :, idx] = new`) for each of K and V

Each call writes all 32 layers (one step's worth); median µs per layer (K and V together) over
40 calls, and a check that the column landed. Usage: proto_kv_write_fused.py [B] [C]"""
import sys
import time

import mlx.core as mx

B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
C = int(sys.argv[2]) if len(sys.argv) > 2 else 256
H, D, L = 8, 128, 32


def col_ix(idx, shape):
    return mx.broadcast_to(idx.reshape(*([1] * len(shape))), shape)


def two(bufs, k, v, idx):
    ix = col_ix(idx, k.shape)
    return [(mx.put_along_axis(kb, ix, k, axis=2), mx.put_along_axis(vb, ix, v, axis=2)) for kb, vb in bufs]


def one(bufs, k, v, idx):
    kv = mx.stack([k, v])  # [2, B, H, 1, D]
    ix = col_ix(idx, kv.shape)
    return [mx.put_along_axis(b, ix, kv, axis=3) for b in bufs]


def flat(bufs, k, v, idx):
    kf, vf = k.reshape(B * H, 1, D), v.reshape(B * H, 1, D)
    ix = col_ix(idx, kf.shape)
    return [(mx.put_along_axis(kb.reshape(B * H, C, D), ix, kf, axis=1).reshape(B, H, C, D),
             mx.put_along_axis(vb.reshape(B * H, C, D), ix, vf, axis=1).reshape(B, H, C, D)) for kb, vb in bufs]


def at_set(bufs, k, v, idx):
    out = []
    for kb, vb in bufs:
        kb[:, :, idx] = k[:, :, 0]
        vb[:, :, idx] = v[:, :, 0]
        out.append((kb, vb))
    return out


def landed(out, col):
    k_buf, v_buf = out[0][0], out[0][1]  # a (K, V) pair, or K and V of one [2, ...] buffer
    return all(bool(mx.all(a[:, :, col] == 1).item()) for a in (k_buf, v_buf))


for name, f, make in (
        ("two scatters", two, lambda: [(mx.zeros((B, H, C, D), mx.bfloat16), mx.zeros((B, H, C, D), mx.bfloat16))
                                       for _ in range(L)]),
        ("one scatter", one, lambda: [mx.zeros((2, B, H, C, D), mx.bfloat16) for _ in range(L)]),
        ("flat scatter", flat, lambda: [(mx.zeros((B, H, C, D), mx.bfloat16), mx.zeros((B, H, C, D), mx.bfloat16))
                                        for _ in range(L)]),
        ("setitem", at_set, lambda: [(mx.zeros((B, H, C, D), mx.bfloat16), mx.zeros((B, H, C, D), mx.bfloat16))
                                      for _ in range(L)])):
    try:
        cf = mx.compile(f)
        bufs = make()
        k = mx.ones((B, H, 1, D), mx.bfloat16)
        v = mx.ones((B, H, 1, D), mx.bfloat16)
        mx.eval(bufs, k, v)
        ts = []
        for i in range(45):
            idx = mx.array(i % C, dtype=mx.int32)
            mx.synchronize()
            t0 = time.perf_counter()
            bufs = cf(bufs, k, v, idx)
            mx.eval(bufs)
            mx.synchronize()
            ts.append(time.perf_counter() - t0)
        ts = sorted(ts[5:])
        ok = landed(bufs, 7)
        print(f"B={B} C={C} {name:14s} {ts[len(ts) // 2] * 1e6 / L:7.1f} µs per layer (K and V), column landed: {ok}",
              flush=True)
    except Exception as e:  # noqa: BLE001 - one variant failing must not hide the others
        print(f"B={B} C={C} {name:14s} failed: {type(e).__name__}: {e}", flush=True)
