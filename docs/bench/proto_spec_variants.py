"""A/B of verify-step variants on the grounded workload, one process: plain, speculative as
shipped, and speculative with the verify's positions padded to 2/3/5/9/17 (fewer distinct
kernel shapes, so MLX's CUDA graph cache sees fewer topologies). Prints tokens/s min / median /
max over `repeats` (interleaved, after a warm-up) and the host ms per verify step by part.
Usage: proto_spec_variants.py MODEL [batch] [repeats] [k]; DEQUANTIZE=1 runs the model's
weights dequantized to bf16. Env vars such as
MLX_CUDA_GRAPH_CACHE_SIZE apply to the whole process (run it once per setting)."""

import os
import statistics
import sys
import time

from graphc.runtime import Engine, SamplingParams
from graphc.benchmarks.grounded import grounded_prompts

path = sys.argv[1]
B = int(sys.argv[2]) if len(sys.argv) > 2 else 1
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
k = int(sys.argv[4]) if len(sys.argv) > 4 else 8
eng = Engine.load(path, max_batch=max(B, 1), spec_adaptive=False)
if os.environ.get("DEQUANTIZE"):  # the same weights as bf16 (quantized matmuls at M > 1 cost more host time)
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model

    dequantize_model(eng.model)
    eng.model.set_dtype(mx.bfloat16)
prompts = grounded_prompts(eng.tokenizer, B, seed=0, vocab=eng.vocab_size)
spec = SamplingParams(max_tokens=96, speculative="prompt_lookup", num_draft_tokens=k)
modes = {"plain": (SamplingParams(max_tokens=96, speculative="off"), False), "spec": (spec, False),
         "spec_padded": (spec, True)}
tps = {m: [] for m in modes}
parts = {m: dict.fromkeys(eng.speculator.timing, 0.0) for m in modes}
steps = dict.fromkeys(modes, 0)
for r in range(reps + 1):
    for m, (p, pad) in modes.items():
        eng.speculator.pad_positions = pad
        s0, h0 = eng.stats["spec_steps"], dict(eng.speculator.timing)
        t0 = time.perf_counter()
        out = eng.generate(prompts, p)
        dt = time.perf_counter() - t0
        if r:
            tps[m].append(sum(len(o.token_ids) for o in out) / dt)
            steps[m] += eng.stats["spec_steps"] - s0
            for key in h0:
                parts[m][key] += eng.speculator.timing[key] - h0[key]
for m in modes:
    v = sorted(tps[m])
    per = {key: round(1e3 * x / steps[m], 2) for key, x in parts[m].items()} if steps[m] else {}
    print(f"B={B} {m}: {v[0]:.1f} / {statistics.median(v):.1f} / {v[-1]:.1f} tok/s, {steps[m]} verifies, ms/verify {per}",
          flush=True)
