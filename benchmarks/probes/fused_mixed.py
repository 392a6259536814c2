"""Would one forward that carries the decode rows and a prompt chunk together meet the serving ITL
goal (a step with prompt work <= 1.5x the decode step; docs/serving-bench.md, "Why ITL p99 stays
above 1.5x the decode step")? Measured before the runtime is changed for it.

A llama-shape model folder, mlx-lm's own modules and KVCache, eager, no graphc engine. `--rows`
rows decode at `--context` tokens each; the steps chain as graphc's do (step N+1 is queued on
step N's lazy tokens, then step N's tokens are read). Per step, timed over `--steps` steps,
alternating the arms in `--rounds` rounds (each arm warmed up first):

- `decode`: the plain decode step, chained (the reference);
- `separate`: what graphc's runner does today: the decode step, then the prompt chunk's own
  forward with its first token read on the host before the next decode step is queued;
- `separate-queued`: the same two forwards, the prompt's first token left lazy (no host read in
  between, so the chain keeps its overlap);
- `fused`: one forward per step, graphc's mixed stack (compiler/mixed_forward.py, what
  `--mixed-step on` runs): the rows' tokens and the prompt chunk's side by side as one
  [1, rows + n] sequence through the norms, projections and MLP (one matmul each), split only for
  RoPE, the K/V writes and attention (each part with its own cache), chained;
- `fused-sync`: the fused forward with a host read after each step (no chain).

Every prompt chunk is `--prompt` tokens over `--prompt-context` cached tokens (a prompt's later
chunk; 0: its first), a fresh cache each step. Before timing, the fused forward's logits are
compared with the separate forwards' (rows and the prompt's last position): max |diff| and
whether the argmax tokens agree.

    python benchmarks/probes/fused_mixed.py --model /tmp/serving-models/llama-3.2-1b --rows 64 \\
        --context 512 --prompt 256 --json fused-mixed-1b.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache

from graphc.compiler.mixed_forward import mixed_hidden

ARMS = ("decode", "separate", "separate-queued", "fused", "fused-sync")


def filled_cache(model, batch: int, tokens: int) -> list:
    """One KVCache per layer holding `tokens` random positions for `batch` rows."""
    a = model.model.layers[0].self_attn
    dtype = model.model.embed_tokens.weight.dtype
    caches = []
    for _ in model.model.layers:
        c = KVCache()
        if tokens:
            k = mx.random.normal((batch, a.n_kv_heads, tokens, a.head_dim if hasattr(a, "head_dim") else
                                  model.args.hidden_size // model.args.num_attention_heads)).astype(dtype)
            c.update_and_fetch(k, k * 0.5)
        caches.append(c)
    mx.eval([x for c in caches if c.keys is not None for x in (c.keys, c.values)])
    return caches


def head(model, h):
    """Final norm + LM head on the last position of each row: [B, V]."""
    h = model.model.norm(h[:, -1:, :])
    out = model.model.embed_tokens.as_linear(h) if model.args.tie_word_embeddings else model.lm_head(h)
    return out[:, 0, :]


def plain_forward(model, tokens, caches):
    """mlx-lm's own forward (its norm and head included), the last position's logits; a chunk of
    several tokens split as graphc's final chunk is (all but the last fill the caches, then the
    last alone), so no position but the last runs the head or the last layer's MLP."""
    if tokens.shape[1] > 1:
        model.model(tokens[:, :-1], cache=caches)  # its output is never read: only the K/V writes run
        tokens = tokens[:, -1:]
    return model(tokens, cache=caches)[:, -1, :]


def fused_forward(model, row_tokens, prompt_tokens, cd: list, cp: list):
    """graphc's mixed stack (compiler/mixed_forward.py) on mlx-lm's caches: the rows' logits
    [rows, V] and the prompt's last-position logits [1, V], one forward."""
    binding = SimpleNamespace(adapter=SimpleNamespace(embed=model.model.embed_tokens, layers=model.model.layers))
    n = prompt_tokens.shape[1]
    h_rows, h_prompt = mixed_hidden(binding, row_tokens, cd, prompt_tokens, cp, n - 1)
    logits = head(model, mx.concatenate([h_rows, h_prompt]))
    return logits[:-1], logits[-1:]


def check(model, rows: int, context: int, prompt: int, prompt_context: int, vocab: int) -> dict:
    """Fused against separate on the same inputs and caches."""
    toks = mx.random.randint(3, vocab, (rows, 1))
    ptoks = mx.random.randint(3, vocab, (1, prompt))
    mx.random.seed(1)
    cd1, cp1 = filled_cache(model, rows, context), filled_cache(model, 1, prompt_context)
    mx.random.seed(1)
    cd2, cp2 = filled_cache(model, rows, context), filled_cache(model, 1, prompt_context)
    dec, pre = plain_forward(model, toks, cd1), plain_forward(model, ptoks, cp1)
    fdec, fpre = fused_forward(model, toks, ptoks, cd2, cp2)
    mx.eval(dec, pre, fdec, fpre)
    diff = max(mx.abs(dec - fdec).max().item(), mx.abs(pre - fpre).max().item())
    agree = bool(mx.all(dec.argmax(-1) == fdec.argmax(-1)).item() and mx.all(pre.argmax(-1) == fpre.argmax(-1)).item())
    scale = max(mx.abs(dec).max().item(), mx.abs(pre).max().item())
    return {"max_abs_diff": diff, "max_abs_logit": scale, "argmax_agree": agree}


class Arm:
    """One arm's chained steps over fresh caches (the decode cache grows one position a step)."""

    def __init__(self, name, model, rows, context, prompt, prompt_context, steps, vocab):
        self.name, self.model, self.steps = name, model, steps
        self.cd = filled_cache(model, rows, context)
        self.cps = [filled_cache(model, 1, prompt_context) for _ in range(steps)] if name != "decode" else []
        self.prompts = [mx.random.randint(3, vocab, (1, prompt)) for _ in range(steps)]
        self.first = mx.random.randint(3, vocab, (rows, 1))
        mx.eval(self.first, *self.prompts)

    def launch(self, toks, i):
        m, name = self.model, self.name
        if name == "decode":
            return plain_forward(m, toks, self.cd).argmax(-1, keepdims=True), None
        if name.startswith("fused"):
            d, p = fused_forward(m, toks, self.prompts[i], self.cd, self.cps[i])
            return d.argmax(-1, keepdims=True), p.argmax(-1)
        nxt = plain_forward(m, toks, self.cd).argmax(-1, keepdims=True)
        mx.async_eval(nxt)
        first = plain_forward(m, self.prompts[i], self.cps[i]).argmax(-1)
        if name == "separate":
            first.item()  # the runner's first-token read, before the next decode step is queued
        return nxt, first

    def run(self) -> list[float]:
        """Wall ms between consecutive token reads, as a stream sees them."""
        sync = self.name == "fused-sync"
        cur, first = self.launch(self.first, 0)
        mx.async_eval(cur, *([first] if first is not None else []))
        gaps, t = [], time.perf_counter()
        for i in range(1, self.steps):
            if sync:
                cur.tolist()
                nxt, first = self.launch(cur, i)
                mx.eval(nxt, *([first] if first is not None else []))
            else:
                nxt, first = self.launch(cur, i)
                mx.async_eval(nxt, *([first] if first is not None else []))
                cur.tolist()
            now = time.perf_counter()
            gaps.append((now - t) * 1e3)
            t, cur = now, nxt
        cur.tolist()
        return gaps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/probes/fused_mixed.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a llama-shape model folder (make_shape, make-model)")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--context", type=int, default=512, help="cached tokens of each decoding row")
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens a mixed step carries")
    p.add_argument("--prompt-context", type=int, default=0, help="cached tokens before that chunk")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--dtype", choices=("model", "float32"), default="model",
                   help="float32: the weights cast up first, so the check tells rounding from a wrong result")
    p.add_argument("--json")
    a = p.parse_args(argv)
    print(f"loading {a.model}", file=sys.stderr, flush=True)
    model, _ = load(a.model)
    if a.dtype == "float32":
        model.set_dtype(mx.float32)
    if not isinstance(model, llama.Model):
        raise SystemExit(f"{type(model).__module__} is not mlx-lm's llama model: this probe runs llama blocks")
    vocab = model.args.vocab_size
    mx.random.seed(0)
    out = {"device": str(mx.default_device()), "rows": a.rows, "context": a.context, "prompt": a.prompt,
           "prompt_context": a.prompt_context, "steps": a.steps, "rounds": a.rounds}
    out["check"] = check(model, a.rows, a.context, a.prompt, a.prompt_context, vocab)
    print(f"fused vs separate logits: max |diff| {out['check']['max_abs_diff']:.3g} "
          f"(logits up to {out['check']['max_abs_logit']:.3g}), argmax agree: {out['check']['argmax_agree']}",
          file=sys.stderr, flush=True)
    arms = [x for x in a.arms.split(",") if x]
    gaps = {x: [] for x in arms}
    for r in range(a.rounds + 1):  # round 0 warms every arm's kernels up and is not kept
        for name in arms:
            g = Arm(name, model, a.rows, a.context, a.prompt, a.prompt_context, a.steps, vocab).run()
            if r:
                gaps[name] += g
                print(f"round {r} {name}: p50 {statistics.median(g):.2f} ms", file=sys.stderr, flush=True)
    base = statistics.median(gaps["decode"]) if "decode" in gaps else None
    out["arms"] = {}
    print(f"{out['device']}: {a.rows} rows at {a.context} tokens, prompt chunk {a.prompt} over {a.prompt_context}")
    print("| arm | step p50 ms | p90 ms | / decode p50 |\n|---|---|---|---|")
    for name, g in gaps.items():
        q = statistics.quantiles(g, n=10)
        p50 = statistics.median(g)
        out["arms"][name] = {"p50_ms": p50, "p90_ms": q[-1], "gaps_ms": g}
        print(f"| {name} | {p50:.2f} | {q[-1]:.2f} | {p50 / base:.2f} |" if base else f"| {name} | {p50:.2f} | {q[-1]:.2f} | |")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
