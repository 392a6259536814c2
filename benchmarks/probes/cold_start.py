"""What the first calls cost on a fresh machine: model build, then each public call in turn,
with MLX's kernel cache empty (run it with MLX_PTX_CACHE_DIR set to an empty folder; MLX
otherwise keeps built kernels under /tmp/mlx/<version>/ptx for the machine's lifetime).

On a fresh H200, `step_profile --paired` at 1B batch 64 spent more than 150 s before its
first pair (model build and two warm-up calls, greedy and sampled). This
splits that time: the wall seconds of the build and of five calls in a row of the same kind
(B fresh 128-token prompts, 16 new tokens each), the first paying for every kernel build and
trace, the later ones showing when it settles.

Usage: MLX_PTX_CACHE_DIR=$(mktemp -d) benchmarks/probes/cold_start.py SHAPE B WHO [ENGINE_KW_JSON]
       WHO: graphc (Engine.generate, greedy then sampled), graphc-warm (the same after the
            server's warm-up, runtime/warmup.py, timed: what a batch-1 warm-up leaves
            to the first calls at batch B) or mlx-lm (batch_generate, the same)
"""

import graphc.contracts  # noqa: F401  before mlx.core: MLX sizes its attention plan cache then

import json
import random
import sys
import time

now = time.perf_counter
t0 = now()
import mlx.core as mx  # noqa: E402  (the import is part of what a fresh process pays)

from graphc.benchmarks import contestants as C  # noqa: E402
from graphc.benchmarks.shapes import load_shape  # noqa: E402
from graphc.benchmarks.user_api import SAMPLING, GraphcUser, batch_generate  # noqa: E402

shape, B, who = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kw = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {"compile": "auto"}
model, tokenizer, config, label = load_shape(shape, "bfloat16")
mx.eval(model.parameters())
t_load = now() - t0
if who in ("graphc", "graphc-warm"):
    t1 = now()
    user = GraphcUser(model, tokenizer, config, **kw)
    print(f"{label} B={B} {who} {kw}: import + build {t_load:.1f} s, Engine {now() - t1:.1f} s", flush=True)
    if who == "graphc-warm":
        print(f"  Engine.warm_up() (batch 1, greedy + sampled): {user.engine.warm_up():.2f} s", flush=True)
    call = user.generate
else:
    print(f"{label} B={B} mlx-lm batch_generate: import + build {t_load:.1f} s", flush=True)
    call = lambda ps, n, s=None: batch_generate(model, tokenizer, ps, n, s)  # noqa: E731
rng = random.Random(0)
vocab = int(config["vocab_size"])
for kind, s in (("greedy", None), ("sampled", SAMPLING)):
    walls = []
    for _ in range(5):
        t1 = now()
        call([[rng.randrange(3, vocab) for _ in range(128)] for _ in range(B)], 16, s)
        walls.append(now() - t1)
    print(f"  {kind}: five calls in a row, wall s: " + " ".join(f"{w:.2f}" for w in walls), flush=True)
print(f"  total {now() - t0:.1f} s", flush=True)
C.free()
