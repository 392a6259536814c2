"""What `cpu_weights` buys on the CPU (runtime/cpu_weights.py): a quantized or half-precision model,
cold prefill and decode, graphc as loaded by default (`auto`: float32) and as stored, against
mlx-lm's BatchGenerator on the model as stored (what `mlx_lm.server` runs) and on the converted one.

    python benchmarks/probes/cpu_weights.py --model SmolLM2-135M-Instruct.Q4_1.gguf [--n 4 --len 256
        --batch 8 --new 32 --repeats 3]

Per repeat, the arms alternate; fresh random prompts every call. Prefill: wall time of n prompts
of `len` tokens to every first token. Decode: `batch` prompts of 16 tokens, `new` tokens each,
generated tokens over the wall time after the first token (the end-to-end time minus a
max_tokens=1 call on other prompts of the same shape). Reports median (min-max) per arm.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from statistics import median

import graphc.contracts  # noqa: F401  (the BLAS choice, before mlx.core)
import mlx_lm
from mlx_lm.generate import BatchGenerator

from graphc.benchmarks import contestants as C
from graphc.benchmarks.user_api import batch_generate
from graphc.compiler.gguf import resolve_model_path
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.cpu_weights import WeightsChoice, apply


def fresh(rng, n, length, vocab):
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def graphc_arm(engine):
    def run(prompts, new):
        res = engine.generate(prompts, SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True))
        return sum(len(r.token_ids) for r in res)
    return run


def batchgen_arm(model, tokenizer):
    def run(prompts, new):
        if new == 1:  # BatchGenerator with batch_generate's defaults, one token each
            gen = BatchGenerator(model, max_tokens=1)
            _, n, _ = C.batchgen_first_times(gen, prompts)
            gen.close()
            return n
        return batch_generate(model, tokenizer, prompts, new)[1]
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a quantized or float16/bfloat16 model folder or .gguf")
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arms", default="graphc,graphc-stored,mlx-lm,mlx-lm-float32")
    a = p.parse_args(argv)
    path = resolve_model_path(a.model)
    arms = {}
    for name in a.arms.split(","):
        if name == "graphc":
            arms[name] = graphc_arm(Engine.load(a.model))
        elif name == "graphc-stored":
            arms[name] = graphc_arm(Engine.load(a.model, cpu_weights="stored"))
        elif name in ("mlx-lm", "mlx-lm-float32"):
            model, tokenizer = mlx_lm.load(str(path))
            if name == "mlx-lm-float32":
                apply(model, WeightsChoice("float32", "probe"))
            arms[name] = batchgen_arm(model, tokenizer)
        else:
            raise SystemExit(f"unknown arm {name!r}")
    vocab = 1000  # token ids well inside any vocabulary
    rng = random.Random(0)
    got = {name: {"prefill_s": [], "decode_tok_s": []} for name in arms}
    for name, run in arms.items():  # warm-up at both shapes
        run(fresh(rng, a.n, a.len, vocab), 1)
        run(fresh(rng, a.batch, 16, vocab), 2)
    for rep in range(a.repeats):
        order = list(arms) if rep % 2 == 0 else list(reversed(arms))
        for name in order:
            run = arms[name]
            t = time.perf_counter()
            run(fresh(rng, a.n, a.len, vocab), 1)
            got[name]["prefill_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            run(fresh(rng, a.batch, 16, vocab), 1)
            first = time.perf_counter() - t
            t = time.perf_counter()
            n = run(fresh(rng, a.batch, 16, vocab), a.new)
            whole = time.perf_counter() - t
            got[name]["decode_tok_s"].append((n - a.batch) / max(whole - first, 1e-9))
            print(f"repeat {rep} {name}: prefill {got[name]['prefill_s'][-1]:.2f} s, decode "
                  f"{got[name]['decode_tok_s'][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    print(f"{path.name}: {a.n} x {a.len}-token prompts cold, then batch {a.batch} x {a.new} new tokens; "
          f"median (min-max) of {a.repeats}")
    for name, g in got.items():
        pf, dc = g["prefill_s"], g["decode_tok_s"]
        print(f"  {name:15s} prefill {median(pf):7.2f} s ({min(pf):.2f}-{max(pf):.2f})   "
              f"decode {median(dc):8.1f} tok/s ({min(dc):.1f}-{max(dc):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
