"""`graphc bench --user-api --user-workloads grounded`: speculative decoding on an input-grounded task.

Each prompt is a given text (a story from the repo's tale generator, compiler/modelgen/tales.py)
followed by an instruction to repeat it (through the model's chat template when it has one), the
kind of request prompt lookup is for: the answer copies long runs of its input. One Engine
times `Engine.generate` on the same prompts with `speculative="off"` and with
`speculative="prompt_lookup"`, interleaved, `repeats` times each (after one warm-up of
each), greedy, stopping at EOS or `long_new` tokens. Reported per batch size: generated
tokens/s (min / median / max), the speculative/plain ratio of medians (and, with the measured
gate on — the default — the same requests ungated as a third mode), the acceptance rate
(accepted / drafted draft tokens) and tokens per verify step — and a note if the outputs
differ (they must not: greedy speculative output is the target's own).

With the user-api's compile on (its default) the Engine decodes with compile="auto", so plain
steps and verify forwards run traced; `--no-compile` measures the eager engine.

Random-weight shapes do not copy their input, so their acceptance is ~0: run it with
`--model DIR` (or a .gguf file) of a trained model.
"""

from __future__ import annotations

import time
from typing import Callable

from graphc.compiler.modelgen.tales import tales
from graphc.runtime import SamplingParams

from . import contestants as C

INSTRUCTION = "Repeat the text above exactly, word for word."


def grounded_prompts(tokenizer, n: int, seed: int = 0, vocab: int | None = None) -> list:
    """n prompts (token ids): a different story each, then the instruction. A bench shape's
    id-only tokenizer gets the text's bytes as ids (`vocab` given), so the workload still runs."""
    out = []
    for text in tales(n, seed=seed):
        msg = f"{text}\n\n{INSTRUCTION}"
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": msg}], add_generation_prompt=True)
        else:
            try:
                ids = tokenizer.encode(msg)
            except Exception:  # noqa: BLE001 - the bench shapes' IdTokenizer encodes nothing
                if vocab is None:
                    raise
                ids = [3 + b % (vocab - 3) for b in msg.encode()]
        out.append(list(ids))
    return out


def run_grounded(model, tokenizer, config, cfg, log: Callable[[str], None] = print,
                 spread=None, compare=None) -> tuple[list, list]:
    """Rows for the user-api report (workload "grounded") and notes."""
    rows, notes = [], []
    # compile: the user-api default (--compile) decodes with compile="auto" — plain steps and
    # verify forwards traced up to 64 rows; --no-compile: eager, the engine's default.
    auto = "auto" if getattr(cfg, "compile", False) else None
    eng = C.make_engine(model, tokenizer, config, max_batch=max(max(cfg.batches), 1), compile=auto)
    if eng.speculator.problem:
        notes.append(f"grounded: speculative decoding is off for this model: {eng.speculator.problem}")
        return rows, notes
    k = getattr(cfg, "num_draft_tokens", None)
    spec = SamplingParams(max_tokens=cfg.long_new, speculative="prompt_lookup", num_draft_tokens=k)
    # (params, measured gate on): with the gate on (the default) the same speculative requests
    # also run ungated — verifying whenever a row drafted — so the report shows what it buys.
    gate = eng.speculator.gate
    modes = {"plain": (SamplingParams(max_tokens=cfg.long_new, speculative="off"), gate),
             "speculative": (spec, gate)}
    if gate is not None:
        modes["ungated"] = (spec, None)

    def run(name, prompts):
        p, eng.speculator.gate = modes[name]
        return eng.generate(prompts, p)

    for B in cfg.batches:
        prompts = grounded_prompts(tokenizer, B, seed=cfg.seed, vocab=int(config["vocab_size"]))
        # A cold plain run first puts the prompts into the prefix cache; then every mode runs once
        # (warm-up) on the same cached prompts, so outputs are compared at the same cache state.
        # In bf16 on a GPU a prefix-cache hit alone can change greedy tokens (the prompt's last
        # positions are computed in a forward of another shape, which rounds differently); that
        # is reported on its own, not blamed on speculation.
        cold = [r.token_ids for r in run("plain", prompts)]
        outs = {name: [r.token_ids for r in run(name, prompts)] for name in modes}
        if cold != outs["plain"]:
            notes.append(f"grounded B={B}: plain greedy output changed between a cold prefill and a prefix-cache "
                         f"hit (float rounding of different prefill shapes, not speculation)")
        for name in modes:
            if outs[name] != outs["plain"]:
                notes.append(f"grounded B={B}: {name} output differs from plain greedy output")
        tps: dict = {n: [] for n in modes}
        d: dict = {}  # the speculative mode's own counters
        timing = dict.fromkeys(eng.speculator.timing, 0.0)
        for _ in range(cfg.repeats):
            for name in modes:
                s0, h0 = dict(eng.stats), dict(eng.speculator.timing)
                t0 = time.perf_counter()
                res = run(name, prompts)
                tps[name].append(sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0))
                if name == "speculative":
                    for key in eng.stats:
                        if key.startswith("spec_"):
                            d[key] = d.get(key, 0) + eng.stats[key] - s0.get(key, 0)
                    for key in timing:
                        timing[key] += eng.speculator.timing[key] - h0[key]
        stats = {n: spread(v) for n, v in tps.items()}
        acc = d["spec_accepted_tokens"] / d["spec_drafted_tokens"] if d.get("spec_drafted_tokens") else 0.0
        per_step = d["spec_emitted_tokens"] / d["spec_steps"] if d.get("spec_steps") else 0.0
        ratios = {"speculative/plain": compare(stats["speculative"], stats["plain"], False)}
        if "ungated" in stats:
            ratios["ungated/plain"] = compare(stats["ungated"], stats["plain"], False)
            ratios["speculative/ungated"] = compare(stats["speculative"], stats["ungated"], False)
        row = {"workload": "grounded", "case": f"B={B}", "batch": B, "unit": "generated tok/s",
               "values": stats, "lower_is_better": False,
               "ratios": ratios, "acceptance": acc, "tokens_per_verify_step": per_step,
               "verify_steps": d.get("spec_steps", 0), "pipelined_verify_steps": d.get("spec_pipelined_steps", 0),
               "pipeline_discards": d.get("spec_pipeline_discards", 0),
               # host ms per verify step, by part (Speculator.timing)
               "verify_ms": ({key: 1e3 * v / d["spec_steps"] for key, v in timing.items()}
                             if d.get("spec_steps") else None),
               # What the measured gate saw (tokens/s, samples per arm and batch bucket), if on.
               "gate": ({str(b): {a: list(v) for a, v in arms.items()} for b, arms in gate.rates().items()}
                        if gate is not None else None),
               "new_tokens": sum(map(len, outs["plain"])) / B}
        rows.append(row)
        extra = f" (ungated {stats['ungated']['median']:.1f})" if "ungated" in stats else ""
        log(f"[user-api] grounded B={B}: plain {stats['plain']['median']:.1f} tok/s, speculative "
            f"{stats['speculative']['median']:.1f} tok/s{extra}, acceptance {acc:.2f}, "
            f"{per_step:.2f} tokens/verify step")
    eng.speculator.gate = gate
    del eng
    C.free()
    return rows, notes
