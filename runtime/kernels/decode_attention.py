"""Ragged attention for decode and verify steps: L new queries per row over KV columns
[start[b], end - L + 1 + l) for query l — a CUDA kernel.

Why: on MLX's CUDA backend `mx.fast.scaled_dot_product_attention` takes its fused
one-query kernel only without an array mask and for a single query (a few, in some
versions); a batch whose rows are left-padded (rows join a running batch at different
lengths), a fixed-capacity buffer (the compiled decode path) or a speculative verify
(L = k + 1 causal queries) falls back to a path of several kernels, two of them cuBLAS
calls that each query cuBLAS's heuristics on the host: on the H200 an L = 9 attention cost
~175 us of host encode per layer against ~24 us for one query,
and a verify step is host-bound. This kernel takes each row's first valid column and the
end column instead of a mask — query l of a row sees the columns before it and itself,
causal inside the L new ones — so it is one launch per layer and reads only the columns
that hold the row's context.

Three kernels share those semantics: one block per query head (any head layout), one block
per KV group serving its query heads (grouped-query attention), and the vec kernel, the grouped
one with each key row loaded as 16-byte pieces by a few lanes (from VEC_MIN_BLOCKS blocks up,
where it was faster on the H200). It is used only on CUDA (the compiled decode path; eager
verify forwards and eager decode steps over left-padded rows through runtime/kernel_views.py),
and only after `check()` has compared each kernel with MLX's masked attention on random inputs
in this process (bf16 tolerance; the vec kernel in every configuration VEC_CONFIG can pick);
otherwise the masked MLX attention runs. It does not reproduce MLX's summation order, so its outputs
match to rounding, not bit for bit.

Each `DecodeAttention` holds its own state: its kernel objects (built on first use), the
launch of each shape it has served (kernel, template, grid: worked out once per shape and
configuration), and the verdicts of its checks. The registry (runtime/kernels/registry.py)
lists the one the runtime uses, `KERNEL`; the module-level functions forward to it.

    decode_attention_cuda.py    the CUDA source, assembled from cuda/decode_attention/*.cu
    decode_attention_shapes.py  which kernel takes which heads, its launch shape, `reference`
    decode_attention_check.py   the comparisons `check()` and `write_check()` run
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from . import KernelOp, answers_of, in_process_check, restore_answers
from .decode_attention_check import CHECK_CASES, compare_kind, compare_write_kind, fused_rows_views
from .decode_attention_cuda import new_kernels
from .decode_attention_shapes import (VEC_CONFIG, VEC_MIN_BLOCKS, grouped_warps, reference, takes, vec_config,
                                      vec_fits)

__all__ = ["CHECK_CASES", "KERNEL", "VEC_CONFIG", "VEC_MIN_BLOCKS", "DecodeAttention", "check", "fused_rows_views",
           "grouped_note", "grouped_warps", "kernel_blocks", "ragged_attention", "reference", "takes",
           "vec_config", "vec_fits", "write_check"]


@attrs.frozen
class Launch:
    """How one shape runs: the kernel variant, its template arguments and its grid."""

    kernel: object
    template: tuple
    grid: tuple
    threadgroup: tuple


@attrs.define
class Verdict:
    """A kernel kind's check: whether it may serve, and why not."""

    ok: bool = False
    why: str = "not checked"


class DecodeAttention(KernelOp):
    """Decode attention over ragged rows of a cache, optionally writing the new K/V in place."""

    name = "decode_attention"

    def __init__(self):
        self.kernels = new_kernels()  # (kind, writing) -> Kernel, each built on its first call
        self._launches: dict[tuple, Launch] = {}  # one per (shape, dtype, kind, config, writing)
        # The grouped and vec kernels' verdicts, set by `check()` (which runs before any trace uses them).
        self.verdicts = {"grouped": Verdict(), "vec": Verdict()}
        # Looked up when called (not bound now), so a test can stand in for a comparison.
        self._check = in_process_check(lambda seed: self._compare(seed))
        self._write_check = in_process_check(lambda seed: self._compare_write(seed))

    # -- the interface (kernels.KernelOp) --------------------------------------------------
    def applies(self, Hq: int, Hkv: int, D: int) -> bool:
        return takes(Hq, Hkv, D)

    def check(self, seed: int = 0) -> str | None:
        """None when the kernel matches MLX's masked attention on random inputs here; else why not."""
        return self._check(seed)

    def write_check(self, seed: int = 0) -> str | None:
        """None when every kernel kind that serves also matched in its writing variant here (after
        `check()`); then compiled decode steps write their keys / values through it (`attend_new`)."""
        return self._write_check(seed)

    def reference(self, *args, **kwargs):
        return reference(*args, **kwargs)

    def stored_verdicts(self) -> dict:
        return {"check": answers_of(self._check), "write_check": answers_of(self._write_check),
                "kinds": {k: [v.ok, v.why] for k, v in self.verdicts.items()}}

    def restore_verdicts(self, stored: dict) -> None:
        restore_answers(self._check, stored["check"])
        restore_answers(self._write_check, stored["write_check"])
        for kind, (ok, why) in stored["kinds"].items():
            self.verdicts[kind] = Verdict(ok=ok, why=why)

    def __call__(self, *args, **kwargs):
        return self.attend(*args, **kwargs)

    # -- the kernel ---------------------------------------------------------------------
    def attend(self, q, k, v, start, end, scale: float | mx.array, kind: str | None = None,
               config: tuple[int, int] | None = None, new: tuple | None = None):
        """q [B, Hq, L, D]; k, v [B, Hkv, C, D]; start [B] int32; end [1] int32 -> [B, Hq, L, D].

        `end`: one past the last written column; the L queries are the last L columns written
        (query l sees columns start[b] .. end - L + l). `kind`: "vec" (one block per KV group,
        16-byte loads), "grouped" (one block per KV group), "per_head" (one block per query head),
        or None: the first of those that applies and passed `check()` here. `config`: the vec
        kernel's (warps, keys per lane per trip), else `vec_config`'s choice.

        `new`: (nk, nv), this step's L new keys / values [B, Hkv, L, D]: the kernel reads columns
        end - L .. end - 1 from them and writes them into k and v **in place** (k, v: evaluated or
        lazy buffers the caller keeps using; MLX does not see the write, so nothing else may read
        those columns of k, v before this launch). Only after `write_check()` passed here. This variant
        takes q, k, v, nk, nv and start in any layout whose last dim is contiguous (views of the
        fused q/k/v matmul's rows, as a compiled step makes them) without a copy."""
        B, Hq, L, D = q.shape
        Hkv = k.shape[1]
        if D % 32 or Hkv == 0 or Hq % Hkv:
            raise ValueError(f"ragged attention needs D % 32 == 0 and query heads a multiple of KV heads, got "
                             f"q {q.shape}, k {k.shape}")
        if not isinstance(scale, mx.array):
            scale = mx.array([scale], dtype=mx.float32)
        if new:  # row-contiguous queries (a no-op where they are); the new keys / values are read as they are
            q = mx.contiguous(q)
        ins = [q, k, v, *new, start, end, scale] if new else [q, k, v, start, end, scale]
        if new and not (new[0].shape == new[1].shape == (B, Hkv, L, D)):
            raise ValueError(f"new keys / values must be [B, Hkv, L, D] = {(B, Hkv, L, D)}, got "
                             f"{new[0].shape}, {new[1].shape}")
        if kind is None:
            kind = self.pick(B, Hq, Hkv, L, D, q.dtype.size)
        run = self.launch(B, Hq, Hkv, L, D, q.dtype, kind, config, bool(new))
        (out,) = run.kernel(inputs=ins, template=list(run.template), grid=run.grid, threadgroup=run.threadgroup,
                            output_shapes=[q.shape], output_dtypes=[q.dtype])
        return out

    def pick(self, B: int, Hq: int, Hkv: int, L: int, D: int, itemsize: int) -> str:
        """The kernel kind for these heads: vec from VEC_MIN_BLOCKS blocks where it fits, else
        grouped where it applies, else per head — each only once its check passed here."""
        if self.verdicts["vec"].ok and vec_fits(Hq, Hkv, D, itemsize) and B * Hkv * L >= VEC_MIN_BLOCKS:
            return "vec"
        return "grouped" if grouped_warps(Hq, Hkv, D) and self.verdicts["grouped"].ok else "per_head"

    def launch(self, B: int, Hq: int, Hkv: int, L: int, D: int, dtype, kind: str, config, writing: bool) -> Launch:
        """The launch of one shape and configuration, worked out the first time it is asked for."""
        key = (B, Hq, Hkv, L, D, dtype, kind, config, writing)
        run = self._launches.get(key)
        if run is None:
            run = self._launches[key] = self._plan(B, Hq, Hkv, L, D, dtype, kind, config, writing)
        return run

    def _plan(self, B, Hq, Hkv, L, D, dtype, kind, config, writing) -> Launch:
        kernel = self.kernels[(kind if kind in ("vec", "grouped") else "per_head", writing)]
        if kind == "vec":
            if not vec_fits(Hq, Hkv, D, dtype.size):
                raise ValueError(f"the vec kernel does not take {Hq} query heads, {Hkv} KV heads, D={D} in {dtype}")
            G = Hq // Hkv
            w, kpl = config or vec_config(B * Hkv * L, G, D)
            return Launch(kernel, (("T", dtype), ("D", D), ("G", G), ("WARPS", w), ("KPL", kpl)),
                          (B * Hkv * L * w * 32, 1, 1), (w * 32, 1, 1))
        if kind == "grouped":
            warps = grouped_warps(Hq, Hkv, D)
            if not warps:
                raise ValueError(f"the grouped kernel does not take {Hq} query heads, {Hkv} KV heads, D={D}")
            return Launch(kernel, (("T", dtype), ("D", D), ("G", Hq // Hkv), ("WARPS", warps)),
                          (B * Hkv * L * warps * 32, 1, 1), (warps * 32, 1, 1))
        return Launch(kernel, (("T", dtype), ("D", D)), (B * Hq * L * 128, 1, 1), (128, 1, 1))

    # -- its builds ----------------------------------------------------------------------
    def builds_for(self, Hq: int, Hkv: int, D: int, dtype, max_batch: int, L: int = 1,
                   writing: bool = False) -> list[tuple[int, str]]:
        """(batch size, kind): one batch size for each distinct kernel build (kernel and template
        arguments) that steps of 1..max_batch rows of L queries take at these heads."""
        seen, out = set(), []
        for B in range(1, max_batch + 1):
            kind = self.pick(B, Hq, Hkv, L, D, dtype.size)
            run = self.launch(B, Hq, Hkv, L, D, dtype, kind, None, writing)
            key = (id(run.kernel), run.template)
            if key not in seen:
                seen.add(key)
                out.append((B, kind))
        return out

    def warm(self, Hq: int, Hkv: int, D: int, dtype, max_batch: int, L: int = 1) -> int:
        """Launch each build of `builds_for` once on a few zero columns; how many. Why: MLX loads a
        CUDA kernel's module on its first launch of each template in a process (from the PTX on
        disk, or compiled), which otherwise lands on the first client step of that batch size:
        a batch growing past 8 and past 16 rows (at 8 KV heads) switches kernel build."""
        builds = self.builds_for(Hq, Hkv, D, dtype, max_batch, L)
        for B, kind in builds:
            C = L + 1
            q = mx.zeros((B, Hq, L, D), dtype=dtype)
            kv = mx.zeros((B, Hkv, C, D), dtype=dtype)
            mx.eval(self.attend(q, kv, kv, mx.zeros((B,), dtype=mx.int32), mx.array([C], dtype=mx.int32),
                                D ** -0.5, kind=kind))
        return len(builds)

    # -- its checks ----------------------------------------------------------------------
    def grouped_note(self) -> str:
        """Which kernel serves grouped heads, or why the per-head kernel serves every shape (after
        `check()`)."""
        vec, grouped = self.verdicts["vec"], self.verdicts["grouped"]
        if vec.ok:
            return f"vec from {VEC_MIN_BLOCKS} blocks (rows x KV heads x queries), grouped below"
        note = "grouped by KV head" if grouped.ok else f"per query head ({grouped.why})"
        return note + (f"; vec kernel off ({vec.why})" if vec.why and vec.why != "not checked" else "")

    def _compare_kind(self, seed: int, kind: str) -> str | None:
        return compare_kind(self.attend, seed, kind)

    def _compare(self, seed: int) -> str | None:
        """The per-head kernel must match (else no kernel is used); the grouped and vec ones are
        used where they also match, and their verdicts are kept for `pick` (`grouped_note()`)."""
        why = self._compare_kind(seed, "per_head")
        if why is None:
            for kind, verdict in self.verdicts.items():
                try:
                    g = self._compare_kind(seed, kind)
                except Exception as e:  # noqa: BLE001 - a build failure leaves the per-head kernel in use
                    g = f"{kind} kernel failed: {type(e).__name__}: {e}"
                verdict.ok, verdict.why = g is None, g or ""
        return why

    def _compare_write_kind(self, seed: int, kind: str) -> str | None:
        return compare_write_kind(self.attend, seed, kind)

    def _compare_write(self, seed: int) -> str | None:
        why = self.check(seed)
        if why is not None:
            return f"the attention kernel is off ({why})"
        for kind in ("per_head", "grouped", "vec"):
            if kind == "per_head" or self.verdicts[kind].ok:  # every kind `pick` may choose must also write correctly
                why = self._compare_write_kind(seed, kind)
                if why is not None:
                    return why
        return None


def kernel_blocks(adapter) -> dict:
    """{id(layer): block} for the layers this kernel can serve: the architecture runs them as its
    own block (`ArchAdapter.own_block`, attention through `cache.attend`) and their heads fit
    the kernel (head dim a multiple of 32, query heads a multiple of KV heads)."""
    out = {}
    for layer in adapter.layers if adapter is not None else ():
        block = adapter.own_block(layer)
        a = getattr(layer, "self_attn", None)
        hd, hq, hkv = (getattr(a, n, 0) for n in ("head_dim", "n_heads", "n_kv_heads"))
        if block is not None and takes(hq, hkv, hd):
            out[id(layer)] = block
    return out


# The runtime's instance (the registry lists it); the functions below are its methods, for
# callers that name the module.
KERNEL = DecodeAttention()


def ragged_attention(q, k, v, start, end, scale, kind=None, config=None, new=None):
    """q [B, Hq, L, D]; k, v [B, Hkv, C, D]; start [B] int32; end [1] int32 -> [B, Hq, L, D]
    (`DecodeAttention.attend` of KERNEL)."""
    return KERNEL.attend(q, k, v, start, end, scale, kind=kind, config=config, new=new)


def check(seed: int = 0) -> str | None:
    return KERNEL.check(seed)


def write_check(seed: int = 0) -> str | None:
    return KERNEL.write_check(seed)


def grouped_note() -> str:
    return KERNEL.grouped_note()
