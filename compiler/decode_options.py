"""The graph's `decode:` section: how decode steps are compiled, declared rather than switched by env vars.

    decode:
      compile: true            # mx.compile the decode forward on fixed-shape KV (default false;
                               # auto: compiled for batches up to 64 rows and 32,768 rows x KV
                               # columns, eager beyond; measured:
                               # per batch-size bucket, whichever the live decode steps timed faster)
      fuse_projections: true   # the architecture's fused decode block, where its adapter has one
                               # (llama: q/k/v and gate/up as one matmul each; graphc-owned copies
                               # of those weights, the model untouched) (default true)
      attention_kernel: true   # CUDA: the ragged decode-attention kernel, once it matched MLX (default true)
      kv_write_kernel: true    # CUDA, compiled steps: that kernel also writes the step's K/V columns into
                               # the cache in place, instead of a scatter per layer and plane (default true)
      residual_matmul: true    # CUDA, fused blocks: the residual adds after o_proj / down_proj as the
                               # matmul's C input (cuBLAS adds it in the epilogue; one rounding
                               # instead of two) instead of an add launch each (default true)
      skinny_matmul: false     # CUDA: the 2..64-row matmul kernel, once it matched MLX (default false)
      skinny_table: null       # a tuned launch table for it (`python -m graphc.benchmarks.kernel_tune
                               # --table FILE`); null: the built-in heuristic
      sampling_kernel: true    # CUDA: a sampled step's candidate stage (first K ranks, 1/T, noise)
                               # as one kernel, once it matched MLX bit for bit (default true)
      host_read_pieces: false  # CUDA: the host reads each decode step's tokens as 8-byte copies
                               # (MLX's scalar pool), so no page a later step uses migrates to the
                               # host (a faster lookup under ncu, no gain through the API, so
                               # default false; runtime/host_read.py)
      vacant_rows: auto        # rows whose requests ended stay in the batch until a copy drops them
                               # (runtime/batch_rows.py): quarter = also once past a quarter of the
                               # rows, copies = only by copies the batch takes anyway (a join, a
                               # step that widens the buffers); auto: quarter on the CPU, else copies
      mixed_step: false        # a step's prompt chunk (one request's) runs in the decode step's
                               # forward: norms, projections and MLP once for both, attention per
                               # part (compiler/mixed_forward.py; default false: it lost at the door
                               # on an H100 so far, docs/scheduling.md "Mixed steps")

`Engine(compile=..., skinny_gemm=..., decode_options=...)` may override any of them; the
decode plan's passes (`graphc inspect`) show what was applied and, when it was not, why.
"""

from __future__ import annotations

DECODE_OPTIONS = {
    "compile": (False, "mx.compile the decode forward on fixed-shape KV"),
    "fuse_projections": (True, "the architecture's fused decode block (llama: q/k/v and gate/up as one matmul each)"),
    "attention_kernel": (True, "CUDA: the ragged decode-attention kernel"),
    "kv_write_kernel": (True, "CUDA, compiled steps: the attention kernel writes the step's K/V columns in place"),
    "residual_matmul": (True, "CUDA, fused blocks: each residual add as the o_proj / down_proj matmul's C input"),
    "skinny_matmul": (False, "CUDA: the 2..64-row matmul kernel"),
    "skinny_table": (None, "a tuned launch table (JSON) for the skinny matmul; null: the built-in heuristic"),
    "sampling_kernel": (True, "CUDA: the sampled step's candidate stage (first K ranks, 1/T, noise) as one kernel"),
    "host_read_pieces": (False, "CUDA: the host reads each decode step's tokens as 8-byte copies (MLX's scalar pool)"),
    "vacant_rows": ("auto", "when rows whose requests ended are dropped: quarter (also past a quarter of the batch), "
                            "copies (only by a join's or a growth's copy), reuse (as copies, and joins write their "
                            "rows into vacant ones in place), auto (quarter on the CPU, else reuse)"),
    "mixed_step": (False, "a prompt chunk rides the decode step's forward (one pass for both; llama blocks, "
                          "plain FullKV; compiler/mixed_forward.py)"),
}

VACANT_ROWS = ("auto", "quarter", "copies", "reuse")

# Options that only compiled decode steps read (runtime/compiled_decode.py): unused while the
# plan's compile mode is eager.
COMPILED_ONLY = ("fuse_projections", "kv_write_kernel", "residual_matmul", "skinny_matmul", "skinny_table")

# The command line's `--compile` (graphc serve / generate): its words and the Engine's `compile=`.
COMPILE_FLAG = {"graph": None, "off": False, "on": True, "auto": "auto", "measured": "measured"}
COMPILE_FLAG_HELP = ("decode under mx.compile: on, off, auto (compiled up to 64 rows and 32,768 rows x KV columns, "
                     "eager beyond: the fastest setting measured on the H200, docs/performance.md; the fused "
                     "projections cost memory, docs/graph-format.md), measured (per batch size, whichever "
                     "timed faster); default: what the graph's `decode:` section says (off)")


def defaults() -> dict:
    return {k: d for k, (d, _) in DECODE_OPTIONS.items()}


def resolve(declared: dict, overrides: dict | None = None) -> dict:
    """Defaults <- the graph's `decode:` <- explicit overrides (None values leave the graph's)."""
    out = defaults()
    out.update(declared)
    out.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = [k for k in out if k not in DECODE_OPTIONS]
    if unknown:
        raise ValueError(f"unknown decode option(s) {', '.join(unknown)} (known: {', '.join(DECODE_OPTIONS)})")
    return out


def problems(raw) -> list[str]:
    """What is wrong with a graph's `decode:` mapping (for the validator)."""
    if not isinstance(raw, dict):
        return ["`decode` must be a mapping, e.g. `decode: {compile: true}`"]
    out = []
    for k, v in raw.items():
        if k not in DECODE_OPTIONS:
            out.append(f"unknown decode option '{k}' (known: {', '.join(DECODE_OPTIONS)})")
        elif k == "skinny_table":
            if v is not None and not isinstance(v, str):
                out.append(f"decode option 'skinny_table' must be a file path or null, got {v!r}")
        elif k == "vacant_rows":
            if v not in VACANT_ROWS:
                out.append(f"decode option 'vacant_rows' must be {', '.join(VACANT_ROWS)}, got {v!r}")
        elif not isinstance(v, bool) and not (k == "compile" and v in ("auto", "measured")):
            allowed = "true, false, auto or measured" if k == "compile" else "true or false"
            out.append(f"decode option '{k}' must be {allowed}, got {v!r}")
    return out


def compile_pass(options: dict, lowering: str, applied: dict | None = None) -> tuple[str, str] | None:
    """The decode plan's `compile` pass line, or None when compile is off.

    `applied`: what the runtime actually switched on ({"fused": note of the adapter's fused blocks,
    "attention_kernel": note, "skinny_matmul": note}), when known; before an engine compiles, only
    "fused" (what the adapter would fuse)."""
    if not options.get("compile"):
        return None
    if lowering != "fast":
        return ("compile", "declared but not applied: the generic lowering runs the model's own forward "
                           "uncompiled (compile needs the fast path)")
    parts = ["mx.compile of embed/attention/logits on fixed-shape KV (capacity buckets); batches whose caches "
             "are not all plain FullKV or kv_bits' quantized KV run uncompiled; the head ops run as lowered"]
    if options.get("compile") == "auto":  # where compiled measured slower (docs/performance.md)
        parts.append("compile: auto — only batches up to runtime/compiled_decode.py AUTO_MAX_BATCH rows and "
                     "AUTO_MAX_KV rows x KV capacity; the others run the eager step on the same caches")
    elif options.get("compile") == "measured":
        parts.append("compile: measured — per batch-size bucket the compiled and the eager step are timed "
                     "on the live decode cycles and the faster runs (runtime/measured_gate.py)")
    fused = (applied or {}).get("fused")
    if not options.get("fuse_projections"):
        parts.append("fuse_projections: off")
    elif fused:
        parts.append(fused)
    for key, label in (("attention_kernel", "ragged attention kernel"), ("kv_write_kernel", "K/V write"),
                       ("residual_matmul", "residual adds"), ("skinny_matmul", "skinny matmul")):
        if not options.get(key):
            parts.append(f"{label}: off")
        elif applied and applied.get(key) is not None:
            parts.append(f"{label}: {applied[key]}")
        else:
            parts.append(f"{label}: on where it builds and matches MLX (CUDA)")
    if options.get("skinny_matmul") and options.get("skinny_table"):
        parts.append(f"skinny table: {options['skinny_table']}")
    return ("compile", "; ".join(parts))
