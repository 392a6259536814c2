"""Train graphc's built-in demo model: a small llama that writes English.

    python examples/train_demo_model.py          # 10-25 min on 2 CPU cores
    python examples/train_demo_model.py --steps 50 --out /tmp/demo-test

It trains mlx-lm's own llama class on the repo's corpus
(``compiler/modelgen/corpus``: generated fairy tales and an EB1911 article),
with the make-model BPE tokenizer, holds out 5% of the
documents to report perplexity, and saves a normal model folder (config.json,
model.safetensors, tokenizer files, training.json) that ``mlx_lm.load`` and
``graphc`` read. See docs/demo-model.md for the recorded run.

MLX's CPU build ships a slow reference BLAS; when Debian's OpenBLAS is
installed (``apt-get install libopenblas0-pthread``) this script re-runs
itself with it preloaded (``--no-openblas`` to skip): about 10x faster here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
REPO = Path(__file__).resolve().parents[1]

CHAT_PROMPTS = [
    "Tell me a story.",
    "Can you tell me a bedtime story?",
    "Write a short fairy tale.",
    "Tell me a story about friendship.",
    "Please tell me a little story.",
    "I can't sleep. Tell me a story?",
    "Write a story for a child.",
    "Tell me a tale about a long journey.",
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "compiler" / "modelgen" / "demo"))
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--intermediate-size", type=int, default=704)
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=350)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--val-frac", type=float, default=0.05)
    p.add_argument("--chat-frac", type=float, default=0.2,
                   help="share of tales also shown wrapped in the ChatML template")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--no-openblas", action="store_true")
    return p.parse_args(argv)


def _display_path(path: Path) -> str:
    """Repo-relative when inside the repo, so the record reads the same anywhere."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def maybe_reexec_with_openblas(args) -> None:
    if args.no_openblas or os.environ.get("LD_PRELOAD") or not os.path.exists(OPENBLAS):
        return
    env = dict(os.environ, LD_PRELOAD=OPENBLAS)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def documents() -> list[tuple[str, str]]:
    """(source, text) pairs: one per tale; other files in ~2 KB paragraph chunks."""
    from graphc.compiler.modelgen.tokenizer import corpus_files

    docs = []
    for path in corpus_files():
        paras = [p for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
        if path.name == "tales.txt":
            docs += [("tales", p) for p in paras]
            continue
        chunk: list[str] = []
        size = 0
        for para in paras:
            chunk.append(para)
            size += len(para)
            if size >= 2000:
                docs.append((path.stem, "\n\n".join(chunk)))
                chunk, size = [], 0
        if chunk:
            docs.append((path.stem, "\n\n".join(chunk)))
    return docs


def tokenize(docs, tok, eot: int, rng: random.Random, chat_frac: float):
    import numpy as np

    ids: list[int] = []
    for source, text in docs:
        if source == "tales" and rng.random() < chat_frac:
            # Teach the chat template's shape so chat requests get a story back.
            text = (
                f"<|im_start|>user\n{rng.choice(CHAT_PROMPTS)}<|im_end|>\n"
                f"<|im_start|>assistant\n{text}<|im_end|>\n"
            )
        ids += tok.encode(text).ids
        ids.append(eot)
    return np.array(ids, dtype=np.int32)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.warmup = min(args.warmup, args.steps // 10)
    maybe_reexec_with_openblas(args)

    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np
    from mlx.utils import tree_flatten
    from tokenizers import Tokenizer

    from graphc.compiler.modelgen.make import make_config
    from graphc.compiler.modelgen.tokenizer import ENDOFTEXT, tokenizer_json, write_tokenizer
    from graphc.compiler.modelgen.weights import build_model

    t_start = time.time()
    mx.random.seed(args.seed)
    rng = random.Random(args.seed)

    tok = Tokenizer.from_str(tokenizer_json(args.vocab_size))
    eot = tok.token_to_id(ENDOFTEXT)
    docs = documents()
    rng.shuffle(docs)
    n_val = max(1, int(len(docs) * args.val_frac))
    val_docs, train_docs = docs[:n_val], docs[n_val:]
    train = tokenize(train_docs, tok, eot, rng, args.chat_frac)
    # Validation is plain text only, so perplexity means "on held-out corpus text".
    val = tokenize(val_docs, tok, eot, rng, 0.0)
    print(f"docs: {len(train_docs)} train / {len(val_docs)} val; "
          f"tokens: {train.size:,} train / {val.size:,} val", flush=True)

    cfg = make_config(
        "llama",
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_heads,
        intermediate_size=args.intermediate_size,
        vocab_size=args.vocab_size,
        dtype=args.save_dtype,
        max_position_embeddings=2048,
    )
    model = build_model(cfg)
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"model: llama {n_params / 1e6:.2f}M params", flush=True)

    schedule = optim.join_schedules(
        [
            optim.linear_schedule(1e-6, args.lr, args.warmup),
            optim.cosine_decay(args.lr, args.steps - args.warmup, end=args.lr * 0.1),
        ],
        [args.warmup],
    )
    opt = optim.AdamW(learning_rate=schedule, weight_decay=args.weight_decay)

    def loss_fn(m, x, y):
        return nn.losses.cross_entropy(m(x), y).mean()

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, opt.state]

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(model, grads)
        return loss

    step = mx.compile(step, inputs=state, outputs=state)
    # Not compiled: a compiled closure would freeze the weights it first saw.
    def eval_loss(x, y):
        return loss_fn(model, x, y)

    T, B = args.seq_len, args.batch_size
    np_rng = np.random.default_rng(args.seed)

    def batch():
        starts = np_rng.integers(0, train.size - T - 1, size=B)
        win = np.stack([train[s : s + T + 1] for s in starts])
        return mx.array(win[:, :-1]), mx.array(win[:, 1:])

    def validate() -> float:
        n = (val.size - 1) // T
        xs = val[: n * T].reshape(n, T)
        ys = val[1 : n * T + 1].reshape(n, T)
        total = 0.0
        for i in range(0, n, 32):
            x, y = mx.array(xs[i : i + 32]), mx.array(ys[i : i + 32])
            total += eval_loss(x, y).item() * x.shape[0]
        return total / n

    t_train = time.time()
    ema = None
    for it in range(1, args.steps + 1):
        x, y = batch()
        loss = step(x, y)
        mx.eval(loss, state)
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if it % 10 == 0:
            el = time.time() - t_train
            print(f"step {it}/{args.steps} loss {ema:.3f} lr {schedule(it).item():.2e} "
                  f"{it * B * T / el:,.0f} tok/s {el / 60:.1f} min", flush=True)
        if args.eval_every and it % args.eval_every == 0 and it < args.steps:
            vl = validate()
            print(f"  val loss {vl:.3f} ppl {math.exp(vl):.2f}", flush=True)
    train_s = time.time() - t_train
    val_loss = validate()
    print(f"final val loss {val_loss:.3f} ppl {math.exp(val_loss):.2f} "
          f"(train {train_s / 60:.1f} min)", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model*.safetensors"):
        old.unlink()
    weights = {k: v.astype(getattr(mx, args.save_dtype)) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    write_tokenizer(out, args.vocab_size)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")

    # Check the saved folder through the path users take, in the saved dtype.
    import mlx_lm

    m2, tok2 = mlx_lm.load(str(out))
    sample = mlx_lm.generate(m2, tok2, "Once upon a time", max_tokens=60, verbose=False)
    print("sample:", "Once upon a time" + sample, flush=True)

    record = {
        "command": "python " + " ".join([sys.argv[0], *sys.argv[1:]]),
        "args": {**vars(args), "out": _display_path(out)},
        "params": n_params,
        "train_tokens": int(train.size),
        "val_tokens": int(val.size),
        "tokens_seen": args.steps * B * T,
        "val_loss": round(val_loss, 4),
        "val_perplexity": round(math.exp(val_loss), 3),
        "train_minutes": round(train_s / 60, 2),
        "total_minutes": round((time.time() - t_start) / 60, 2),
        "blas": "openblas (LD_PRELOAD)" if "openblas" in os.environ.get("LD_PRELOAD", "") else "mlx default",
        "sample_greedy": "Once upon a time" + sample,
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"saved to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
