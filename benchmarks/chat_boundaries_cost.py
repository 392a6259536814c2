"""What finding chat message boundaries costs the server (runtime/server/message_bounds.py): a long
chat templated through apply_chat_template(tokenize=True), against render_with_boundaries (one
render, one tokenization with offsets, a text render per marked message). Medians of --repeats.

    python -m graphc.benchmarks.chat_boundaries_cost --model DIR [--messages 41] [--words 700]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from mlx_lm.utils import load_tokenizer

from graphc.runtime.server.message_bounds import render_with_boundaries

WORDS = "the of and to in is that for it as with was on be by this are or from at an".split()


def _timed(f, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a model folder with a chat template")
    ap.add_argument("--messages", type=int, default=41, help="messages (a system message, then user / assistant)")
    ap.add_argument("--words", type=int, default=700, help="words per user / assistant message")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    tok = load_tokenizer(Path(args.model))
    rng = random.Random(0)
    msgs = [{"role": "system", "content": "you are a coding agent"}]
    for i in range(args.messages - 1):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant",
                     "content": " ".join(rng.choice(WORDS) for _ in range(args.words))})
    flags = dict(add_generation_prompt=True, continue_final_message=False)
    ids = list(tok.apply_chat_template(msgs, tokenize=True, **flags))
    got, bounds = render_with_boundaries(tok, msgs, flags, {})
    assert got == ids, "render_with_boundaries gave other token ids than apply_chat_template"
    for name, f in (("apply_chat_template(tokenize=True)", lambda: tok.apply_chat_template(msgs, tokenize=True, **flags)),
                    ("render_with_boundaries", lambda: render_with_boundaries(tok, msgs, flags, {}))):
        xs = _timed(f, args.repeats)
        print(f"{name}: {statistics.median(xs) * 1e3:.1f} ms median ({min(xs) * 1e3:.1f}-{max(xs) * 1e3:.1f}), "
              f"{len(ids)} tokens, {len(msgs)} messages, {len(bounds)} boundaries")


if __name__ == "__main__":
    main()
