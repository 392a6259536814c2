"""Which model types mlx-lm's own batching answers differently from its own one-request forward:
two prompts of different lengths through a tiny random-weight model of every type, greedy, once
one prompt at a time (`model(prompt, cache=make_prompt_cache(model))`, then one token a step: the
self-check's reference, compiler/selfcheck.py) and once together through mlx-lm's
`BatchGenerator` (mlx_lm/generate.py, what `mlx_lm.server` batches with).

    python tests/conformance/mlx_lm_batch.py [MODEL_TYPE ...]

Prints a line a type: `same`, `different` with both token lists, or why it could not run; and
where feeding the prompt's last token alone (as mlx_lm.generate does) changes the one-request
tokens, that too. Why it
exists: it decided that mlx-lm's batch is no reference for the self-check's batched rows, and it
shows where `mlx_lm.server` answers a request differently when another shares its batch
(docs/models.md).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm.generate import BatchGenerator  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from models_table import mlx_lm_model_types  # noqa: E402
from tiny_models import build_model_folder  # noqa: E402

# mlx-lm's own forward of phi3small corrupts the heap on the CPU build (docs/supported-models.md)
SKIP = {"phi3small"}
PROMPTS = [[11, 23, 5, 17, 29, 3, 8, 40, 41, 42], [19, 7, 26, 2]]  # ids any tiny vocabulary has
TOKENS = 8


def one_at_a_time(model, prompt: list[int], last_alone: bool = False) -> list[int]:
    """Greedy tokens of one request; `last_alone`: the prompt's last token fed by itself, as
    mlx_lm.generate feeds it (the self-check's second reference)."""
    cache, out = make_prompt_cache(model), []
    if last_alone:
        model(mx.array(prompt[:-1])[None], cache=cache)
    y = model(mx.array(prompt[-1:] if last_alone else prompt)[None], cache=cache)
    for _ in range(TOKENS):
        out.append(int(mx.argmax(y[0, -1])))
        y = model(mx.array([[out[-1]]]), cache=cache)
    return out


def batched(model) -> list[list[int]]:
    gen = BatchGenerator(model, max_tokens=TOKENS, stop_tokens=set())
    uids = gen.insert(PROMPTS, max_tokens=[TOKENS] * len(PROMPTS))
    got = {u: [] for u in uids}
    for _ in range(10 * TOKENS):  # prompt steps answer nothing; a bound in case it never finishes
        out = gen.next()
        for r in (out[1] if isinstance(out, tuple) else out) or []:
            got[r.uid].append(r.token)
        if all(len(v) >= TOKENS for v in got.values()):
            break
    return [got[u][:TOKENS] for u in uids]


def main(types: list[str]) -> None:
    for t in types or [t for t in mlx_lm_model_types() if t not in SKIP]:
        try:
            model, _ = mlx_lm.load(str(build_model_folder(t, tempfile.mkdtemp(), seed=0)))
            want = [one_at_a_time(model, p) for p in PROMPTS]
            alone = [one_at_a_time(model, p, last_alone=True) for p in PROMPTS]
        except Exception as e:  # noqa: BLE001 - a type without a reference is reported, not fatal
            print(f"{t} no reference: {type(e).__name__}: {str(e)[:100]}", flush=True)
            continue
        last = "" if alone == want else f" (the last token alone: different, {alone})"
        try:
            got = batched(model)
        except Exception as e:  # noqa: BLE001 - what BatchGenerator cannot batch
            print(f"{t} BatchGenerator raised {type(e).__name__}: {str(e)[:100]}{last}", flush=True)
            continue
        print(f"{t} " + ("same" if got == want else f"different: batched {got}, one at a time {want}") + last,
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
