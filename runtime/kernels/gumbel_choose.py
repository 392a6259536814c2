"""A sampled row's filters and Gumbel-max over its first K ranks, in one launch.

After the top-ranks kernel (top_ranks.py) a fused sampled step has, per row, its first K ranks'
ids, scaled logits s and uniform noise u. `select.choose` turns them into a token with MLX's ops:
the top-p prefix sums' total at rank top_k − 1 (a gather), the exclusive sums (a concatenate), the
keep mask, s + Gumbel noise, an argmax and a gather of the id — five launches after the scan,
each encoded on the host, and at Llama-3.2-1B batch 64 the step is bound by that host encode
(docs/performance.md, runs 17 and 21). Here one block a row does all of it:

    keep  = rank < min(top_k, K)                                  (use_top_k)
          & (excl_r < top_p · c[min(top_k, K) − 1]  or  top_p ≥ 1)  (use_top_p; c: the scan)
          & (s_r − s_0 ≥ log min_p)                                (use_min_p)
    token = ids[argmax over kept ranks of s_r − log(−log(u_r))]    (lowest rank on ties)

The inclusive prefix sums `c` stay MLX's own `mx.cumsum` (select.top_p_sums): its association
order is the CUDA backend's, so the kernel reads them instead of adding in another order. Every
other operation is exact or the same correctly rounded float function MLX's kernels call
(`log`, IEEE compares, one add, one multiply; MLX builds without fast math, and this kernel goes
through the same NVRTC), and the argmax keeps MLX's rule (the larger value, the lower index on
ties), so a row picks the token `select.choose` picks. `check_config()` compares the two on this
device before a configuration (K and the filters in use) is first used, on random rows with and
without ties and with masked ranks; otherwise MLX's ops run (`check()` does every configuration
at once, for the bench). NaN logits may pick differently (as in top_ranks.py).
"""

from __future__ import annotations

import mlx.core as mx

from . import Kernel, in_process_check

_SOURCE = r"""
    // One block per row, K threads (K: the candidate width, a power of two <= 256).
    const int row = blockIdx.x;
    const int i = threadIdx.x;
    const size_t base = (size_t)row * K;
    const float sv = s[base + i];
    const int kk = min(top_k[row], K);  // select.rank_masks: rank < min(top_k, K); the last kept rank kk - 1
    bool keep = true;
    if (USE_TOP_K) keep = i < kk;
    if (USE_TOP_P) {
      const float tp = top_p[row];
      const float excl = i == 0 ? 0.0f : c[base + i - 1];
      keep = keep && ((excl < tp * c[base + kk - 1]) || (tp >= 1.0f));
    }
    if (USE_MIN_P) keep = keep && ((sv - s[base]) >= log_min_p[row]);
    const float g = -logf(-logf(u[base + i]));  // noise.gumbel_from_uniform (libdevice's logf, as MLX's Log)
    __shared__ float best[K];
    __shared__ int at[K];
    best[i] = keep ? sv + g : __uint_as_float(0xFF800000u);  // -inf
    at[i] = i;
    __syncthreads();
    // argmax as MLX's: the larger value, or on a tie the lower rank
    for (int w = K / 2; w > 0; w >>= 1) {
      if (i < w) {
        const float a = best[i], b = best[i + w];
        if (a < b || (a == b && at[i + w] < at[i])) { best[i] = b; at[i] = at[i + w]; }
      }
      __syncthreads();
    }
    if (i == 0) token[row] = ids[base + at[0]];
"""

_kernel = Kernel("graphc_gumbel_choose", ["s", "ids", "u", "c", "top_k", "top_p", "log_min_p"], ["token"], _SOURCE)

MAX_WIDTH = 256


def usable(width: int, use_top_k: bool, use_top_p: bool, use_min_p: bool) -> bool:
    """The kernel takes this width (one thread a rank) and, in this configuration, matched MLX here
    (`check_config`; False off CUDA)."""
    return (16 <= width <= MAX_WIDTH and width & (width - 1) == 0
            and check_config(width, use_top_k, use_top_p, use_min_p) is None)


def choose(s: mx.array, ids: mx.array, u: mx.array, c: mx.array | None, top_k: mx.array, top_p: mx.array,
           log_min_p: mx.array, *, use_top_k: bool, use_top_p: bool, use_min_p: bool) -> mx.array:
    """Tokens int32 [B] (see the module doc). s, u float32 [B, K]; ids int32 [B, K]; c: the
    inclusive top-p sums float32 [B, K] (select.top_p_sums; None without top-p); per-row top_k
    int32, top_p and log_min_p float32 [B]."""
    b, k = s.shape
    if c is None:
        c = s  # not read (USE_TOP_P is false): any float32 [B, K] array
    return _kernel(
        inputs=[s, ids, u, c, top_k.astype(mx.int32), top_p.astype(mx.float32), log_min_p.astype(mx.float32)],
        template=[("K", k), ("USE_TOP_K", use_top_k), ("USE_TOP_P", use_top_p), ("USE_MIN_P", use_min_p)],
        grid=(b * k, 1, 1),
        threadgroup=(k, 1, 1),
        output_shapes=[(b,)],
        output_dtypes=[mx.int32],
    )[0]


def reference(s, ids, u, top_k, top_p, log_min_p, *, use_top_k: bool, use_top_p: bool, use_min_p: bool):
    """The same tokens from MLX's ops: what the fused selection computes without the kernel."""
    from ..sampling.noise import gumbel_from_uniform
    from ..sampling.select import choose as mlx_choose

    return mlx_choose(s, ids, gumbel_from_uniform(u), top_k, top_p, log_min_p,
                      use_top_k=use_top_k, use_top_p=use_top_p, use_min_p=use_min_p)


FLAGS = tuple((k, p, m) for k in (False, True) for p in (False, True) for m in (False, True))
# (B, K, tie step of s or 0) that check() compares at, every filter combination each
CHECK_CASES = ((64, 64, 0.0), (5, 16, 0.5), (3, 128, 0.0), (7, 256, 0.25), (4, 32, 0.0))


def _compare(seed: int, cases=CHECK_CASES, flags=FLAGS) -> str | None:
    from ..sampling.select import top_p_sums

    key = mx.random.key(seed)
    for (B, K, tie) in cases:
        k1, k2, k3, k4, k5, k6, key = mx.random.split(key, 7)
        # descending scaled logits in rank order (as the top-ranks kernel gives them), masked ranks
        s = -mx.sort(-mx.random.normal((B, K), key=k1) * 2.0, axis=-1)
        if tie:
            s = mx.round(s / tie) * tie
        s = mx.where(mx.random.uniform(shape=(B, K), key=k2) < 0.05, -mx.inf, s)
        s = mx.concatenate([mx.maximum(s[:, :1], 0.0), s[:, 1:]], axis=1)  # rank 0 finite
        ids = mx.random.randint(0, 200000, (B, K), key=k3).astype(mx.int32)
        u = mx.clip(mx.random.uniform(shape=(B, K), key=k4), 2.0**-32, 1 - 2.0**-24)
        top_k = mx.random.randint(1, K + 8, (B,), key=k5).astype(mx.int32)
        k6a, k6b = mx.random.split(k6)
        top_p = mx.where(mx.arange(B) % 3 == 0, 1.0, mx.random.uniform(0.05, 1.0, (B,), key=k6a))
        log_min_p = mx.where(mx.arange(B) % 2 == 0, -mx.inf, mx.log(mx.random.uniform(0.001, 0.5, (B,), key=k6b)))
        for use_k, use_p, use_m in flags:
            keep_k = (mx.arange(K)[None] < mx.minimum(top_k, K)[:, None]) if use_k else None
            c = top_p_sums(s, keep_k) if use_p else None
            want = reference(s, ids, u, top_k, top_p, log_min_p, use_top_k=use_k, use_top_p=use_p, use_min_p=use_m)
            got = choose(s, ids, u, c, top_k, top_p, log_min_p, use_top_k=use_k, use_top_p=use_p, use_min_p=use_m)
            if not mx.array_equal(got, want).item():
                bad = int(mx.sum(got != want).item())
                return (f"Gumbel-choose kernel differs from MLX in {bad} of {B} tokens at K={K} "
                        f"(top_k {use_k}, top_p {use_p}, min_p {use_m})")
    return None


# None when the kernel picked MLX's tokens on every case and configuration here; else why not (all 40
# builds: the tests' and the bench's check; the engine asks check_config per configuration instead).
check = in_process_check(_compare)

_configs: dict = {}  # (K, use_top_k, use_top_p, use_min_p) -> check_config's answer


def check_config(width: int, use_top_k: bool, use_top_p: bool, use_min_p: bool) -> str | None:
    """`check()` for one configuration (one kernel build), on first use of it in this process:
    rows with and without ties at this width. A fused step builds and checks only the
    configuration its rows need, so an engine's first sampled step on a fresh machine pays one
    NVRTC build here, not the 40 of every width and filter combination."""
    key = (width, bool(use_top_k), bool(use_top_p), bool(use_min_p))
    if key not in _configs:
        cases = ((64, width, 0.0), (7, width, 0.5), (5, width, 0.25))
        _configs[key] = in_process_check(lambda seed: _compare(seed, cases, (key[1:],)))()
    return _configs[key]


def note() -> str:
    """For the plan at load: configurations are checked on first use, so it says how."""
    if not _configs:
        return "on where its check passes (one check per width and filter combination, on first use)"
    ok = [k for k, why in _configs.items() if why is None]
    bad = [f"{_label(k)}: {why}" for k, why in _configs.items() if why is not None]
    return "; ".join(([f"on for {', '.join(map(_label, ok))}"] if ok else []) + ([f"off for {'; '.join(bad)}"] if bad else []))


def _label(config: tuple) -> str:
    width, *flags = config
    on = [name for name, f in zip(("top-k", "top-p", "min-p"), flags) if f]
    return f"K={width} ({' + '.join(on) or 'no filter'})"
