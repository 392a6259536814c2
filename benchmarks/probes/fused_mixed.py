"""Would one forward that carries the decode rows and a prompt chunk together meet the serving ITL
goal (a step with prompt work <= 1.5x the decode step; docs/serving-bench.md, "Why ITL p99 stays
above 1.5x the decode step")? Measured before the runtime is changed for it.

A llama-shape model folder, mlx-lm's own modules and KVCache, eager, no graphc runtime. `--rows`
rows decode at `--context` tokens each; the steps chain as graphc's do (step N+1 is queued on
step N's lazy tokens, then step N's tokens are read). Per step, timed over `--steps` steps,
alternating the arms in `--rounds` rounds (each arm warmed up first):

- `decode`: the plain decode step, chained (the reference);
- `separate`: what graphc's runner does today: the decode step, then the prompt chunk's own
  forward with its first token read on the host before the next decode step is queued;
- `separate-queued`: the same two forwards, the prompt's first token left lazy (no host read in
  between, so the chain keeps its overlap);
- `fused`: one forward per step: the rows' tokens and the prompt chunk's tokens side by side as
  one [1, rows + n] sequence through the norms, projections and MLP (one matmul each), split only
  for RoPE, the K/V writes and attention (each part with its own cache), chained;
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

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models import llama
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache

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
    """mlx-lm's own forward (its norm and head included), the last position's logits."""
    return model(tokens, cache=caches)[:, -1, :]


def mixed_layer(layer, x, rows: int, cd, cp, mask_p):
    """One llama block over [1, rows + n, hidden]: the first `rows` positions are one decode
    token per row (cache `cd`, [rows, ...]), the rest one prompt's chunk (cache `cp`)."""
    a = layer.self_attn
    n = x.shape[1] - rows
    xn = layer.input_layernorm(x)
    q, k, v = a.q_proj(xn), a.k_proj(xn), a.v_proj(xn)

    def split(t, heads):
        d = t[0, :rows].reshape(rows, 1, heads, -1).transpose(0, 2, 1, 3)
        p = t[:, rows:].reshape(1, n, heads, -1).transpose(0, 2, 1, 3)
        return d, p

    (qd, qp), (kd, kp), (vd, vp) = split(q, a.n_heads), split(k, a.n_kv_heads), split(v, a.n_kv_heads)
    qd, kd = a.rope(qd, offset=cd.offset), a.rope(kd, offset=cd.offset)
    qp, kp = a.rope(qp, offset=cp.offset), a.rope(kp, offset=cp.offset)
    kd, vd = cd.update_and_fetch(kd, vd)
    kp, vp = cp.update_and_fetch(kp, vp)
    od = scaled_dot_product_attention(qd, kd, vd, cache=cd, scale=a.scale, mask=None)
    op = scaled_dot_product_attention(qp, kp, vp, cache=cp, scale=a.scale, mask=mask_p)
    o = mx.concatenate([od.transpose(0, 2, 1, 3).reshape(1, rows, -1),
                        op.transpose(0, 2, 1, 3).reshape(1, n, -1)], axis=1)
    h = x + a.o_proj(o)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def fused_forward(model, row_tokens, prompt_tokens, cd: list, cp: list):
    """Rows' next-token logits [rows, V] and the prompt's last-position logits [1, V], one forward."""
    rows = row_tokens.shape[0]
    x = model.model.embed_tokens(mx.concatenate([row_tokens.reshape(1, rows), prompt_tokens], axis=1))
    mask_p = "causal" if prompt_tokens.shape[1] > 1 else None
    for layer, d, p in zip(model.model.layers, cd, cp):
        x = mixed_layer(layer, x, rows, d, p, mask_p)
    last = mx.concatenate([x[:, :rows], x[:, -1:]], axis=1).reshape(rows + 1, 1, -1)  # rows, prompt's last
    logits = head(model, last)
    return logits[:rows], logits[rows:]


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
    p.add_argument("--json")
    a = p.parse_args(argv)
    print(f"loading {a.model}", file=sys.stderr, flush=True)
    model, _ = load(a.model)
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
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
