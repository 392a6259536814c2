"""Quantized KV (`--kv-bits`, runtime/cache/quantized.py) against bf16 KV and against mlx-lm.

Three measurements, each on the model given (a folder or .gguf):

- **bytes**: KV bytes per token per layer and over all layers, read from the real cache
  arrays after a prefill (every plane's bytes / its columns / its rows), for the graph's own
  policy and for `kv_bits` 8 and 4;
- **quality**: teacher-forced logprobs. mlx-lm's own forward on its `QuantizedKVCache`
  (the reference) decodes each prompt greedily; graphc then runs the same tokens — prompts
  prefilled alone in chunks, joined into one left-padded decode batch, each row fed the
  reference's tokens — and at every position compares log-softmax rows: mean and max
  |logprob diff| of the reference's token, top-1 agreement, and the mean KL divergence of
  graphc's distribution from the reference's (the whole vocabulary: a peaked model hides
  differences from the token's own logprob). Also reported: graphc's
  unquantized KV against the same reference (what a cache that ignored kv_bits would
  score) and graphc's quantized KV along mlx-lm's greedy tokens on its unquantized
  `KVCache` (what rounding costs);
- **speed**: decode step time of the Engine once every row decodes (prefill not timed), bf16
  KV against 8 and 4 bits, each with compile off and on (the compiled decode path runs
  quantized KV too: runtime/compiled_decode_quantized.py), the arms interleaved and
  repeated, KV bytes per token read from the decode batch's arrays; the same for mlx-lm's own
  loop on KVCache vs QuantizedKVCache. All engines share one loaded model.

    python -m graphc.benchmarks.kv_quantized --model DIR [--repeats 5] [--batch 4]
    python -m graphc.benchmarks.kv_quantized --decode-speed --model llama-3.1-8b --batch 64 \
        [--bits 8 4] [--compile both|on|off] [--no-mlx-lm]   # only the speed block; a shape or a folder
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

from graphc.compiler.gguf import resolve_model_path
from graphc.compiler.lower import StepInputs
from graphc.runtime import Engine, SamplingParams
from graphc.runtime.kernels import quantized_attention, quantized_write

from .env import environment
from .shapes import load_shape


def quantized_reference_caches(model, bits: int, group_size: int = 64) -> list:
    """mlx-lm's prompt caches with every KVCache replaced by QuantizedKVCache(group_size, bits)
    (what mlx-lm's own `--kv-bits` quantizes); other caches unchanged."""

    return [QuantizedKVCache(group_size=group_size, bits=bits) if type(c) is KVCache else c
            for c in make_prompt_cache(model)]


def reference_run(model, prompt: list[int], n: int, caches) -> tuple[list[int], list[mx.array]]:
    """mlx-lm's forward on `caches`: greedy `n` tokens after `prompt`, and the float32 logits
    [V] each was chosen from."""
    logits = model(mx.array(prompt)[None], cache=caches)[0, -1].astype(mx.float32)
    toks, rows = [], []
    for _ in range(n):
        rows.append(logits)
        t = int(mx.argmax(logits))
        toks.append(t)
        logits = model(mx.array([[t]]), cache=caches)[0, -1].astype(mx.float32)
    return toks, rows


def graphc_teacher_forced(engine, prompts: list[list[int]], conts: list[list[int]], chunk: int = 16):
    """graphc's logits along given continuations, per row a list of [V]: each prompt prefilled
    alone in `chunk`-token pieces, the rows joined into one left-padded batch, each decode
    step fed every row's next given token (what the runner does, without the scheduler)."""

    pols = engine.compiled.binding.policies
    caches, rows = None, []
    for p in prompts:
        own = [pol.new_cache() for pol in pols]
        for a in range(0, len(p), chunk):
            end = min(len(p), a + chunk)
            out = engine.compiled.prefill(StepInputs(mx.array(p[a:end], dtype=mx.int32)[None], own,
                                                     final=end == len(p)))
        rows.append([out.logits[0].astype(mx.float32)])
        if caches is None:
            caches = own
        else:
            for mine, theirs in zip(caches, own):
                mine.extend(theirs)
    n = len(conts[0])
    for s in range(n - 1):
        toks = mx.array([[c[s]] for c in conts], dtype=mx.int32)
        out = engine.compiled.decode(StepInputs(toks, caches))
        for i in range(len(prompts)):
            rows[i].append(out.logits[i].astype(mx.float32))
        mx.eval([r[-1] for r in rows])
    return rows, caches


def logprob_agreement(got: list[list[mx.array]], want: list[list[mx.array]], tokens: list[list[int]]) -> dict:
    """Mean / max |log p_got(t) - log p_want(t)| at the reference tokens t, and the fraction of
    positions where got's argmax is t (over every row and position)."""
    diffs, agree, kl = [], [], []
    for g_row, w_row, t_row in zip(got, want, tokens):
        for g, w, t in zip(g_row, w_row, t_row):
            lg = g - mx.logsumexp(g)
            lw = w - mx.logsumexp(w)
            diffs.append(abs(float(lg[t]) - float(lw[t])))
            agree.append(int(mx.argmax(g)) == t)
            kl.append(float(mx.sum(mx.exp(lw) * (lw - lg))))  # KL(want || got) over the vocabulary
    return {"mean_abs_logprob_diff": float(np.mean(diffs)), "max_abs_logprob_diff": float(np.max(diffs)),
            "top1_agreement": float(np.mean(agree)), "mean_kl": float(np.mean(kl)), "positions": len(diffs)}


def quality(model_dir: str, bits: int, prompts: list[list[int]], n: int, group_size: int = 64,
            chunk: int = 16) -> dict:
    """The quality block of this probe for one bits value (see the module docstring)."""


    eng = Engine.load(model_dir, kv_bits=bits, kv_group_size=group_size, prefill_chunk=chunk)
    model = eng.model
    ref = [reference_run(model, p, n, quantized_reference_caches(model, bits, group_size)) for p in prompts]
    tokens = [t for t, _ in ref]
    want = [rows for _, rows in ref]
    got, _ = graphc_teacher_forced(eng, prompts, tokens, chunk)
    plain = Engine.load(model_dir, prefill_chunk=chunk)
    unq, _ = graphc_teacher_forced(plain, prompts, tokens, chunk)
    # What rounding costs: along mlx-lm's own greedy tokens on unquantized KV.
    full = [reference_run(model, p, n, make_prompt_cache(model)) for p in prompts]
    full_tokens = [t for t, _ in full]
    got_full, _ = graphc_teacher_forced(eng, prompts, full_tokens, chunk)
    return {"bits": bits, "group_size": group_size,
            "graphc_quantized_vs_mlx_lm_quantized": logprob_agreement(got, want, tokens),
            "graphc_unquantized_vs_mlx_lm_quantized": logprob_agreement(unq, want, tokens),
            "graphc_quantized_vs_mlx_lm_unquantized": logprob_agreement(got_full, [r for _, r in full], full_tokens)}


def kv_bytes_per_token(caches) -> dict:
    """Per layer with per-token arrays: bytes one token of one row holds, from the arrays
    (each plane's nbytes / (rows x columns)); and their sum."""
    per_layer = []
    for c in caches:
        planes = [getattr(c, name) for name in getattr(c, "PLANES", ())]
        planes = [a for a in planes if a is not None]
        if planes:
            per_layer.append(sum(a.nbytes / (a.shape[0] * a.shape[2]) for a in planes))
    return {"per_layer": per_layer[0] if per_layer else 0.0, "total": float(sum(per_layer)),
            "layers": len(per_layer)}


def bytes_block(model_dir: str, prompt: list[int]) -> dict:

    out = {}
    for bits in (None, 8, 4):
        eng = Engine.load(model_dir, kv_bits=bits, prefix_cache=False)
        caches = [p.new_cache() for p in eng.compiled.binding.policies]
        eng.compiled.prefill(StepInputs(mx.array(prompt, dtype=mx.int32)[None], caches, final=True))
        mx.eval([a for c in caches for a in _arrays(c)])
        out[str(bits or eng.compiled.binding.layers[0].dtype)] = {
            **kv_bytes_per_token(caches), "policy_says": sum(p.bytes_per_token() for p in eng.compiled.binding.policies)}
    return out


def _arrays(c):
    return [getattr(c, n) for n in getattr(c, "PLANES", ()) if getattr(c, n) is not None]


def _engine_decode_s(eng, prompts, n: int) -> tuple[float, dict]:
    """Seconds per decode step of the Engine once every row decodes (prefill not timed), and the
    KV bytes per token of the decode batch's caches (read from their arrays mid-run).

    Every prompt is admitted before any row decodes (a burst as long as all of them: with the
    device's burst the rows past it were prefilled between decode steps, the first rows could
    finish before the last joined, and this loop waited for a full batch forever)."""
    sched = eng.scheduler
    sched.BURST_TOKENS = max(sched.BURST_TOKENS, sum(len(p) for p in prompts))
    for p in prompts:
        eng.add_request(p, SamplingParams(max_tokens=n + 2, ignore_eos=True))
    while eng.has_unfinished() and (sched.waiting or len(eng.runner.rows) < len(prompts)):
        eng.step()
    if len(eng.runner.rows) < len(prompts):
        raise RuntimeError(f"only {len(eng.runner.rows)} of {len(prompts)} rows decoded together")
    eng.step()
    kv = kv_bytes_per_token(eng.runner.caches or [])
    t0, steps = time.perf_counter(), 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
    return (time.perf_counter() - t0) / max(1, steps), kv


def _mlx_lm_decode_s(model, prompts, n: int, caches_fn) -> float:
    """Seconds per step of mlx-lm's own forward decoding `prompts` as one batch (rows of equal
    length: no padding needed) on caches_fn()'s caches, prefill not timed."""
    caches = caches_fn()
    tok = mx.argmax(model(mx.array(prompts), cache=caches)[:, -1], axis=-1)
    mx.eval(tok)
    t0 = time.perf_counter()
    for _ in range(n):
        tok = mx.argmax(model(tok[:, None], cache=caches)[:, -1], axis=-1)
        mx.eval(tok)
    return (time.perf_counter() - t0) / n


def _progress(line: str) -> None:
    print(f"kv_quantized: {line}", file=sys.stderr, flush=True)


def _spread(r: list) -> dict:
    return {"median": round(statistics.median(r), 3), "min": round(min(r), 3), "max": round(max(r), 3)}


def speed(model, tokenizer, config: dict, batch: int, prompt_len: int, n: int, repeats: int,
          bits: tuple = (8, 4), compile_modes: tuple = (False, True), group_size: int = 64,
          mlx_lm_arms: bool = True) -> dict:
    """Decode seconds per step, bf16 (the model's dtype) KV against each of `bits`, for each
    compile mode, on one loaded model shared by every engine; arms interleaved per repeat.
    Ratios are per repeat (same repeat, same compile mode), then median / min / max."""
    rng = np.random.default_rng(0)
    engines = {}
    for c in compile_modes:
        for b in (None, *bits):
            eng = Engine(model, tokenizer, config, kv_bits=b, kv_group_size=group_size if b else None,
                         compile=c, prefix_cache=False, max_batch=batch)
            engines[f"{'compiled' if c else 'eager'}_{b or 'bf16'}"] = eng
    vocab = next(iter(engines.values())).vocab_size
    prompts = [rng.integers(3, vocab, prompt_len).tolist() for _ in range(batch)]
    mlx_arms = {"bf16": lambda: make_prompt_cache(model)} | {
        str(b): (lambda b=b: quantized_reference_caches(model, b, group_size)) for b in bits} if mlx_lm_arms else {}
    kv = {}
    for name, eng in engines.items():  # warm: first calls trace, compile kernels, grow buffers
        _, kv[name] = _engine_decode_s(eng, prompts, 2)
        _progress(f"warmed {name}")
    times = {k: [] for k in engines} | {f"mlx_lm_{k}": [] for k in mlx_arms}
    for rep in range(repeats):
        for name, eng in engines.items():
            times[name].append(_engine_decode_s(eng, prompts, n)[0])
            _progress(f"repeat {rep + 1}/{repeats} {name}: {times[name][-1] * 1e3:.2f} ms a step")
        for name, fn in mlx_arms.items():
            times[f"mlx_lm_{name}"].append(_mlx_lm_decode_s(model, prompts, n, fn))
    out = {"batch": batch, "prompt_len": prompt_len, "new_tokens": n, "repeats": repeats, "group_size": group_size,
           "kv_bytes_per_token": {k: v["total"] for k, v in kv.items()},
           "step_ms": {k: [round(x * 1e3, 3) for x in v] for k, v in times.items()},
           "step_ms_median": {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()}}
    ratios = {}
    for who in [f"{'compiled' if c else 'eager'}" for c in compile_modes] + (["mlx_lm"] if mlx_arms else []):
        base = times[f"{who}_bf16"]
        for b in bits:
            ratios[f"{who}_{b}bit_over_bf16"] = _spread([q / f for q, f in zip(times[f"{who}_{b}"], base)])
    if len(compile_modes) == 2:
        for b in ("bf16", *map(str, bits)):
            ratios[f"compiled_over_eager_{b}"] = _spread([c / e for c, e in zip(times[f"compiled_{b}"],
                                                                                times[f"eager_{b}"])])
    out["ratios"] = ratios
    why = quantized_attention.check()  # answered at the engines' load (runtime/target.py)
    out["quantized_attention"] = quantized_attention.KERNEL.note() if why is None else f"off: {why}"
    wrote = quantized_write.check() if why is None else "the attention kernel is off"
    out["quantized_write"] = ("on: one launch a layer writes a step's new K/V codes" if wrote is None
                              else f"off (mx.quantize + slice writes): {wrote}")
    out["compiled_steps"] = {k: getattr(e.compiled.decode, "compiled_steps", 0) for k, e in engines.items()}
    out["note"] = ("graphc arms: Engine.step() once every row decodes (rows of equal length); compiled arms with "
                   "compile=True; mlx_lm arms: its model forward + argmax per step on the same prompts as one batch; "
                   "ratios: quantized over bf16 (the model's dtype) KV in the same repeat")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quality-prompts", type=int, default=4)
    p.add_argument("--quality-tokens", type=int, default=32)
    p.add_argument("--skip", nargs="*", default=[], choices=["bytes", "quality", "speed"])
    p.add_argument("--decode-speed", action="store_true",
                   help="only the decode step time: bf16 vs --bits KV, compile on and off (--compile), KV bytes per "
                        "token; --model may be a shape of benchmarks/shapes.py (random weights, e.g. llama-3.1-8b)")
    p.add_argument("--bits", type=int, nargs="+", default=[8, 4], choices=[8, 4])
    p.add_argument("--compile", choices=["both", "on", "off"], default="both")
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", help="weights dtype of a --model shape (--decode-speed)")
    p.add_argument("--no-mlx-lm", action="store_true", help="--decode-speed without mlx-lm's own loop arms")
    args = p.parse_args(argv)
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.compile]
    if args.decode_speed:
        model, tokenizer, config, label = load_shape(args.model, args.dtype)
        report = {"model": label, "environment": environment(),
                  "decode_speed": speed(model, tokenizer, config, args.batch, args.prompt_len, args.new_tokens,
                                        args.repeats, tuple(args.bits), modes, args.group_size, not args.no_mlx_lm)}
        print(json.dumps(report, indent=1))
        return 0

    model_dir = str(resolve_model_path(args.model))

    report = {"model": args.model, "environment": environment()}
    rng = np.random.default_rng(1)
    cfg = json.load(open(f"{model_dir}/config.json"))
    vocab = int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size"))
    if "bytes" not in args.skip:
        report["kv_bytes_per_token"] = bytes_block(model_dir, rng.integers(3, vocab, 100).tolist())
    if "quality" not in args.skip:
        lengths = [37, 9, 64, 21][: args.quality_prompts] * (1 + args.quality_prompts // 4)
        prompts = [rng.integers(3, vocab, n).tolist() for n in lengths[: args.quality_prompts]]
        report["quality"] = [quality(model_dir, b, prompts, args.quality_tokens) for b in (8, 4)]
    if "speed" not in args.skip:
        model, tokenizer, config, _ = load_shape(model_dir)
        report["speed"] = speed(model, tokenizer, config, args.batch, args.prompt_len, args.new_tokens, args.repeats,
                                tuple(args.bits), modes, args.group_size)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
