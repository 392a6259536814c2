"""Writing one KV column at an array index inside mx.compile: which op costs what on the device.
[B, H, C, D] bf16 buffers, L layers' worth written per call, column idx given as an array
(what the compiled decode step does). Usage: benchmarks/probes/kv_write.py [B] [C]"""
import sys, time
import mlx.core as mx
B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
C = int(sys.argv[2]) if len(sys.argv) > 2 else 256
H, D, L = 8, 128, 32
def dyn(bufs, upd, idx):
    return [mx.slice_update(b, upd, idx, axes=(2,)) for b in bufs]
def scatter(bufs, upd, idx):
    ix = mx.broadcast_to(idx.reshape(1, 1, 1, 1), upd.shape)
    return [mx.put_along_axis(b, ix, upd, axis=2) for b in bufs]
def scatter_rows(bufs, upd, idx):  # per-row column: [B] indices
    ix = mx.broadcast_to(mx.broadcast_to(idx, (B,)).reshape(B, 1, 1, 1), upd.shape)
    return [mx.put_along_axis(b, ix, upd, axis=2) for b in bufs]
for name, f in (("slice_update(array idx)", dyn), ("put_along_axis", scatter), ("put_along_axis per row", scatter_rows)):
    cf = mx.compile(f)
    bufs = [mx.zeros((B, H, C, D), mx.bfloat16) for _ in range(L)]
    upd = mx.ones((B, H, 1, D), mx.bfloat16)
    mx.eval(bufs, upd)
    ts = []
    for i in range(40):
        idx = mx.array(i % C, dtype=mx.int32)
        mx.synchronize(); t0 = time.perf_counter()
        bufs = cf(bufs, upd, idx)
        mx.eval(bufs); mx.synchronize()
        ts.append(time.perf_counter() - t0)
    ok = bool(mx.all(bufs[0][:, :, 5] == 1).item()) and bool(mx.all(bufs[0][:, :, 45 % C] == 0).item())
    ts.sort()
    print(f"B={B} C={C} {name}: {ts[len(ts)//2] * 1e6 / L:.1f} µs per layer-write (median of 40, {L} writes/call), correct={ok}", flush=True)
