"""How far mlx-lm's own forward lands from itself when only the shapes of its matmuls change, on the
load-time self-check's tokens (compiler/selfcheck.py PROMPTS), against the check's tolerance.

    python benchmarks/probes/selfcheck_noise.py [SHAPE qwen3-next-2b] [SEED 0] [DTYPE bfloat16] [LOWERINGS fast,generic]

(MLX's CPU gather_mm is float32 only: on the CPU a mixture of experts runs with DTYPE float32.)

Rows, each its max |diff| on the last-position logits of prompt 0 against the reference (the
prompt whole, alone):
  chunked   the same prompt through mlx-lm's own caches in pieces: the check's chunks (CHUNK
            tokens), the last token alone (mlx_lm.generate's schedule), both (graphc's generic one)
  batched   the same prompt twice in one batch (identical rows: no padding, no masks); and both
            prompts in one batch as mlx-lm's BatchGenerator joins requests (each row against its
            one-request rows)
  graphc    the self-check of each lowering, as compile_graph runs it (its describe() line)

Why: a bf16 mixture of experts (the bench's qwen3-next-2b, 8 experts, top 2) was refused on an
H100 by every lowering, the generic one (mlx-lm's own forward on graphc's caches) included. If
mlx-lm's own forward moves as far when only its pieces change, the miss is rounding (an expert
choice flipped by it), not a lowering fault. Found (H100, benchmarks/results/h100-selfcheck-noise.txt):
chunks and identical rows are bit-exact; the last token alone moves the row by 1.39 / 4.12 (seeds
0 / 1, tolerance 0.53), exactly the generic lowering's miss, so the self-check now also compares
with that schedule (compiler/selfcheck.py schedules).
"""

from __future__ import annotations

import logging
import sys

import mlx.core as mx
from mlx_lm.generate import _merge_caches
from mlx_lm.models.cache import make_prompt_cache

from graphc.benchmarks.shapes import SHAPES, random_model
from graphc.compiler import selfcheck
from graphc.compiler.compile import compile_graph
from graphc.compiler.errors import UnsupportedModel
from graphc.compiler.target import Requested
from graphc.runtime.target import probe_target

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3-next-2b"
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
dtype = sys.argv[3] if len(sys.argv) > 3 else "bfloat16"
cfg = dict(SHAPES[shape])
model = random_model(cfg, getattr(mx, dtype), seed)
ref = selfcheck.reference_run(model, cfg["model_type"])
p = selfcheck.PROMPTS[0]
want = ref.logits[0][0]
print(f"{shape} {dtype} seed {seed} on {mx.default_device()}: logit scale {ref.scale:.3g}, "
      f"tolerance {ref.tolerance:.3g}", flush=True)


def diff(got) -> str:
    d = float(mx.abs(got.astype(mx.float32) - want).max())
    return f"max |diff| {d:.3g} ({d / ref.tolerance:.2f}x the tolerance)"


def schedule(pieces) -> mx.array:
    """Prompt 0 through mlx-lm's own forward and caches, in pieces of these lengths."""
    cache, a = make_prompt_cache(model), 0
    for n in pieces:
        last = model(mx.array(p[a:a + n])[None], cache=cache)
        a += n
    return last[0, -1]


c = selfcheck.CHUNK
for pieces, what in (((c, len(p) - c), f"chunked ({c}-token chunks)"),
                     ((len(p) - 1, 1), "the last token alone (as mlx_lm.generate prefills)"),
                     ((c, len(p) - c - 1, 1), "chunked, the last chunk split (graphc's generic schedule)")):
    print(f"  mlx-lm {what} {pieces}: {diff(schedule(pieces))}", flush=True)
two = model(mx.array([p, p]), cache=make_prompt_cache(model))
print(f"  mlx-lm batched (2 identical rows): {diff(two[0, -1])}", flush=True)
# The check's batched rows against mlx-lm's own batch of its two prompts, joined the way its
# BatchGenerator joins requests (mlx_lm/generate.py: `_merge_caches`, all but the last tokens
# prefilled together right-padded, then batched steps; the decode tokens forced as the check's):
# if mlx-lm's batch lands as far from the one-request rows as a lowering's batched rows do, the miss
# is how batches round here, not how graphc batches.
try:
    caches = _merge_caches([make_prompt_cache(model) for _ in selfcheck.PROMPTS])
    heads = [list(q[:-1]) for q in selfcheck.PROMPTS]
    pad = [max(map(len, heads)) - len(h) for h in heads]
    for cache in caches:
        cache.prepare(lengths=[len(h) for h in heads], right_padding=pad)
    model(mx.array([h + [0] * n for h, n in zip(heads, pad)]), cache=caches)
    for cache in caches:
        cache.finalize()
    rows = [model(mx.array(step)[:, None], cache=caches)[:, -1].astype(mx.float32)
            for step in ([q[-1] for q in selfcheck.PROMPTS], *([t] * 2 for t in selfcheck.DECODE))]
    for i in range(len(selfcheck.PROMPTS)):
        ds = [float(mx.abs(r[i] - w).max()) for r, w in zip(rows, ref.logits[i])]
        print(f"  mlx-lm's batch, prompt {i} (last prefill row, decode 1, decode 2): "
              + ", ".join(f"{d:.3g}" for d in ds) + f" (tolerance {ref.tolerance:.3g})", flush=True)
except Exception as e:  # noqa: BLE001 - a diagnosis line, not the probe's point
    print(f"  mlx-lm's batch: {type(e).__name__}: {e}", flush=True)
logging.basicConfig(level=logging.WARNING, format="  log: %(message)s")
target = probe_target()
for lowering in sys.argv[4].split(",") if len(sys.argv) > 4 else ("fast", "generic"):
    for linear in ("auto", "mlx-lm", "chunked") if lowering == "fast" else ("auto",):
        try:
            compiled = compile_graph(None, model, cfg, lowering=lowering, target=target,
                                     requested=Requested(linear_prefill=linear))
            print(f"  graphc {lowering} linear_prefill={linear}: served; "
                  + "; ".join(c.describe() for c in compiled.binding.checks), flush=True)
        except (UnsupportedModel, ValueError) as e:
            print(f"  graphc {lowering} linear_prefill={linear}: refused: {str(e)[:600]}", flush=True)
