"""What tokenizing a growing conversation's prompt costs at the server, whole against reusing the
previous turn's tokens (runtime/server/prefix_tokens.py): the agent replay's turns
(benchmarks/agent_replay.py `conversation`), each timed both ways, tokens compared.

    python benchmarks/probes/prefix_tokens.py --model DIR --context 32768 --turns 32 [--shape llama-3.1-8b]

`--shape`: no model folder needed; make_shape's tokenizer for that shape is written to --model
(its vocabulary only, no weights).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from transformers import AutoTokenizer

from graphc.benchmarks.agent_replay import conversation
from graphc.benchmarks.serving.make_shape import cover_vocab, write_tokenizer
from graphc.benchmarks.shapes import SHAPES
from graphc.runtime.server.prefix_tokens import PrefixTokens


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/probes/prefix_tokens.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model folder (its tokenizer.json), or where --shape writes one")
    p.add_argument("--shape", help="write make_shape's tokenizer of this bench shape to --model first")
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--turns", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    if a.shape:
        out = Path(a.model)
        out.mkdir(parents=True, exist_ok=True)
        vocab = SHAPES[a.shape]["vocab_size"]
        write_tokenizer(out, vocab)
        cover_vocab(out / "tokenizer.json", vocab)
        (out / "config.json").write_text(json.dumps({"model_type": SHAPES[a.shape]["model_type"], "vocab_size": vocab}))
    hf = AutoTokenizer.from_pretrained(a.model)
    turns, _ = conversation(a.model, a.context, a.turns, 0)
    whole, reused = [], []
    for _ in range(a.repeats):
        pt = PrefixTokens(hf)
        for k, t in enumerate(turns):
            t0 = time.perf_counter()
            ids_whole = hf.encode(t.prompt)
            t1 = time.perf_counter()
            ids = pt.encode(t.prompt)[0]
            t2 = time.perf_counter()
            assert ids == ids_whole, f"turn {k + 1}: reused tokens differ"
            if k == len(turns) - 1:
                whole.append((t1 - t0) * 1e3)
                reused.append((t2 - t1) * 1e3)
    n = len(hf.encode(turns[-1].prompt))
    print(f"last turn ({n} tokens, {len(turns[-1].prompt)} chars), ms over {a.repeats} repeats (min / median / max):")
    for name, xs in (("whole", whole), ("reusing the previous turn's tokens", reused)):
        print(f"  {name:36s} {min(xs):7.1f} / {statistics.median(xs):7.1f} / {max(xs):7.1f}")
    print(f"  reuse enabled: {pt.enabled} ({pt.why_not or 'byte-level BPE'}); checked against whole: {pt.verified}; "
          f"tokens reused over the replay: {pt.reused_tokens}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
