"""How many verify and plain steps prompt lookup needs for a given answer, by drafting policy.

Speculative greedy output is the target's own, so once the plain answer is known, which draft
a policy proposes and how much of it the target accepts follows from the answer alone: no
forward is needed to count a policy's verify steps (V) and plain steps (P). With the costs of
one verify (v) and one plain step (p) measured on a device, tokens/s over plain is
N p / (V v + P p). This replays runtime/speculative/speculator.py's policy (k adapting,
4 misses pause drafting for 16 tokens, a window of 8 verifies under min_acceptance pauses
for cooldown tokens) on the grounded bench's prompts (benchmarks/grounded.py), with
variants, and prints V, P and the predicted ratio for v/p = 1.0, 1.25, 1.5.
Usage: benchmarks/probes/draft_policy.py MODEL [n_prompts] [new_tokens]   (MODEL: folder or .gguf)
The answers are generated once (plain greedy, this machine) and cached next to the script's
output as JSON (DRAFT_POLICY_CACHE, default /tmp/draft-policy-answers.json)."""

import json
import os
import sys

from graphc.benchmarks.grounded import grounded_prompts
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.speculative.prompt_lookup import NgramIndex


def answers(model: str, n: int, new: int) -> list:
    path = os.environ.get("DRAFT_POLICY_CACHE", "/tmp/draft-policy-answers.json")
    key = f"{model}|{n}|{new}"
    cache = json.load(open(path)) if os.path.exists(path) else {}
    if key not in cache:
        eng = Engine.load(model)
        prompts = grounded_prompts(eng.tokenizer, n, seed=0)
        out = eng.generate(prompts, SamplingParams(max_tokens=new, speculative="off"))
        cache[key] = [[p, r.token_ids] for p, r in zip(prompts, out)]
        json.dump(cache, open(path, "w"))
    return cache[key]


def replay(prompt, out, k_max=8, max_ngram=4, min_ngram=2, miss_pause=16, max_misses=4,
           window=8, min_acceptance=0.15, cooldown=32, grow="one", shrink="half") -> tuple:
    idx = NgramIndex(max_ngram, min_ngram)
    N, pos, V, P, k = len(out), 0, 0, 0, k_max
    misses = paused = drafted_w = accepted_w = steps_w = 0
    while pos < N:
        room = N - pos - 1
        if pos < paused or min(k, room) <= 0:
            P, pos = P + 1, pos + 1
            continue
        d = idx.draft(prompt + out[:pos], min(k, room))
        misses = 0 if d else misses + 1
        if misses >= max_misses:
            misses, paused = 0, pos + miss_pause
        if not d:
            P, pos = P + 1, pos + 1
            continue
        acc = 0
        while acc < len(d) and pos + acc < N and d[acc] == out[pos + acc]:
            acc += 1
        V, pos = V + 1, pos + acc + 1
        if acc == len(d):
            k = min(k + 1, k_max) if grow == "one" else min(2 * k, k_max)
        elif acc == 0:
            k = max(1, k // 2) if shrink == "half" else k
        drafted_w, accepted_w, steps_w = drafted_w + len(d), accepted_w + acc, steps_w + 1
        if steps_w >= window:
            if accepted_w < min_acceptance * drafted_w:
                paused, k = pos + cooldown, k_max
            drafted_w = accepted_w = steps_w = 0
    return V, P, N


VARIANTS = {
    "as shipped (k 8)": {},
    "k 12": {"k_max": 12},
    "k 16": {"k_max": 16},
    "k 16, k doubles": {"k_max": 16, "grow": "double"},
    "k 16, never shrink": {"k_max": 16, "shrink": "none"},
    "k 8, ngram 1-4": {"min_ngram": 1},
    "k 8, ngram 3-6": {"max_ngram": 6, "min_ngram": 3},
    "k 16, ngram 2-6": {"k_max": 16, "max_ngram": 6},
    "k 8, no miss pause": {"max_misses": 10 ** 9},
    "k 8, no cooldown": {"min_acceptance": 0.0},
    "k 8, never shrink": {"shrink": "none"},
    "k 16, never shrink, ngram 2-6": {"k_max": 16, "shrink": "none", "max_ngram": 6},
    "k 16, never shrink, no miss pause": {"k_max": 16, "shrink": "none", "max_misses": 10 ** 9},
    "k 16, never shrink, miss pause 8": {"k_max": 16, "shrink": "none", "miss_pause": 8},
    "k 16, never shrink, no cooldown": {"k_max": 16, "shrink": "none", "min_acceptance": 0.0},
}

if __name__ == "__main__":
    model = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    new = int(sys.argv[3]) if len(sys.argv) > 3 else 96
    data = answers(model, n, new)
    print(f"{n} grounded answers of up to {new} tokens: {[len(o) for _, o in data]} tokens")
    print("| policy | verifies | plain steps | tokens | ratio at v/p 1.0 / 1.25 / 1.5 | per answer (V, P) |")
    print("|---|---|---|---|---|---|")
    for name, kw in VARIANTS.items():
        V = P = N = 0
        each = []
        for p, o in data:
            v, pl, nn = replay(p, o, **kw)
            V, P, N = V + v, P + pl, N + nn
            each.append(f"{v}, {pl}")
        r = " / ".join(f"{N / (V * c + P):.2f}" for c in (1.0, 1.25, 1.5))
        print(f"| {name} | {V} | {P} | {N} | {r} | {'; '.join(each)} |")
