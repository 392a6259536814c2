"""One rank of a distributed test run (tests/test_distributed.py spawns it, one process per rank).

    python distributed_worker.py OUT.json SPEC.json

SPEC: {"models": [dirs], "engine": {Engine.load kwargs}, "prompts": [[ids]], "params": [{SamplingParams}]}.
Every rank loads each model with distributed=True; rank 0 generates the prompts twice (the
second time through the prefix cache) and writes {model dir: {"tokens", "again", "cached_tokens"}}
to OUT.json; the other ranks follow rank 0 through each model
(Engine.load returns on rank 0 only; on the others it raises SystemExit when rank 0 closes).
"""

from __future__ import annotations

import json
import sys

from graphc.runtime import Engine, SamplingParams


def main(out_path: str, spec_path: str) -> int:
    spec = json.loads(open(spec_path).read())
    params = [SamplingParams(**p) for p in spec["params"]]
    results = {}
    for m in spec["models"]:
        try:
            engine = Engine.load(m, distributed=True, **spec["engine"])
        except SystemExit as e:
            if e.code:
                raise
            continue  # a follower that followed rank 0 through this model
        res = engine.generate(spec["prompts"], params)
        # Again: now the prompts come from the prefix cache (each rank's pool holds its KV heads).
        again = engine.generate(spec["prompts"], params)
        results[m] = {"tokens": [r.token_ids for r in res], "again": [r.token_ids for r in again],
                      "cached_tokens": [r.cached_tokens for r in again]}
        engine.close()  # the followers leave this model and load the next one
    if results:
        with open(out_path, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
