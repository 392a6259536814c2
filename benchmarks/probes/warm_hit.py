"""What a prefix hit costs beyond its new tokens: the agent replay's turns through `Engine.step()`
(no HTTP: random token ids, or with `--text` the replay's texts tokenized), cold against warm, and a warm pass repeated on a second
conversation of the same lengths (what the first pass paid once, e.g. attention plans for new
shapes, the second does not), then once more with every runner / prefix-cache phase in a
synchronized timer (benchmarks/probes/step_phases.py's wrappers), phase totals per turn.

    python benchmarks/probes/warm_hit.py --model /tmp/serving-models/llama-3.1-8b --context 32768 --turns 32

`--text`: the turns are the agent replay's own texts (benchmarks/agent_replay.py `conversation`,
seeds 0, 1, 2.. for the cold texts and each warm pass) encoded as `graphc serve` encodes a
completion prompt, so their lengths are the bench's (a few tokens off a multiple of the turn
size), not exact multiples.
"""

from __future__ import annotations

import graphc.contracts  # noqa: F401  before mlx.core: MLX sizes its attention plan cache then

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_phases import instrument  # noqa: E402  (a sibling probe: its synchronized phase wrappers)

from graphc.benchmarks.agent_replay import conversation  # noqa: E402
from graphc.runtime import Engine, SamplingParams  # noqa: E402


PENDING: list[float] = []  # per turn: ms of device work the turn before left queued (e.g. pool writes)


def ttft(engine, ids) -> float:
    """Seconds from add_request to the request's first token (one greedy token). What the turn
    before left queued is waited for first, and its time kept in PENDING: at the door the next
    request's forward would wait for it."""
    t = time.perf_counter()
    mx.synchronize()
    t0 = time.perf_counter()
    PENDING.append((t0 - t) * 1e3)
    rid = engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid and o.new_token_ids:  # a host value: its forward has run
                t = time.perf_counter() - t0
                while engine.has_unfinished():
                    engine.step()
                return t
    return time.perf_counter() - t0


def lengths(context: int, turns: int) -> list[int]:
    return [max(16, context * (k + 1) // turns) for k in range(turns)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/probes/warm_hit.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--turns", type=int, default=32)
    p.add_argument("--warm-passes", type=int, default=2, help="warm replays, each on a conversation of its own")
    p.add_argument("--no-probe", action="store_true", help="skip the synchronized (probed) warm pass")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--text", action="store_true", help="the agent replay's texts, tokenized (see above)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # the load's progress
    engine = Engine.load(a.model)
    if not a.no_warmup:
        engine.warm_up()
    vocab = int(engine.config["vocab_size"])
    rng = random.Random(0)
    ls = lengths(a.context, a.turns)

    def text(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    seeds = iter(range(1000))

    def turns():
        """One conversation's prompts, turn by turn, each a prefix of the next."""
        if not a.text:
            conv = text(a.context)
            return [conv[:n] for n in ls]
        replay, _ = conversation(a.model, a.context, a.turns, next(seeds))
        return [list(engine.tokenizer.encode(r.prompt)) for r in replay]

    def cold_turns():
        if not a.text:
            return [text(n) for n in ls]
        _, cold = conversation(a.model, a.context, a.turns, next(seeds))
        return [list(engine.tokenizer.encode(r.prompt)) for r in cold]

    out = {"args": vars(a), "lengths": ls, "passes": {}}
    cold = [ttft(engine, ids) for ids in cold_turns()]
    out["passes"]["cold"] = cold
    print("cold  :", " ".join(f"{t * 1e3:.0f}" for t in cold), flush=True)
    PENDING.clear()
    ttft(engine, text(16))  # what the cold pass's last turn left queued
    out["pending_after_cold_ms"] = round(PENDING[-1], 1)
    print(f"queued by the cold pass's last turn, waited for before the next: {PENDING[-1]:.1f} ms", flush=True)
    for w in range(a.warm_passes):
        prompts = turns()
        out.setdefault("warm_lengths", []).append([len(x) for x in prompts])
        ts = [ttft(engine, x) for x in prompts]
        out["passes"][f"warm{w + 1}"] = ts
        print(f"warm{w + 1} :", " ".join(f"{t * 1e3:.0f}" for t in ts),
              f"  last/cold {ts[-1] / cold[-1]:.3f}", flush=True)
    if not a.no_probe:
        ph = instrument(engine)
        per_turn = []
        for x in turns():
            ph.calls.clear()
            t = ttft(engine, x)
            per_turn.append({"n": len(x), "ttft_ms": round(t * 1e3, 1), "phases": ph.summary()})
        out["probed"] = per_turn
        for k in (1, 2, len(ls) // 2, len(ls) - 1):
            if k < len(per_turn):
                pt = per_turn[k]
                print(f"probed turn {k + 1} ({pt['n']} tokens): {pt['ttft_ms']} ms")
                for lab, v in sorted(pt["phases"].items(), key=lambda kv: -kv[1]["own_ms_total"]):
                    print(f"   {lab:34s} n={v['n']:3d} own {v['own_ms_total']:8.1f} ms  max {v['own_ms_max']:8.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
