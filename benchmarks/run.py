"""Plan, run and collect the bench: a list of measurements, each one contestant on one workload.

Workloads (all on by default):
  decode    steady-state decode tok/s at each batch size: graphc, graphc+compile, BatchGenerator, plain loop
            (and graphc+compile+skinny where the skinny matmul kernel builds and checks: CUDA)
  host      host ms to build one lazy decode step vs. the device ms it takes (unchained)
  exact     greedy tokens of graphc+compile against graphc (identical on CPU; rounding on GPU)
  prefix    32 requests sharing a 2k-token prefix: TTFT and throughput, prefix cache on/off, BatchGenerator
  sampling  temperature 0.8 / top_p 0.9 / top_k 50 against greedy, graphc and BatchGenerator
  chain     graphc chained against unchained decode
  matmul    a bare `x @ W.T` at the model's shapes for B rows (GPU by default): MLX's own ceiling,
            and graphc's skinny matmul kernel where it works
"""

from __future__ import annotations

import math
import random
import time
from importlib import resources
from statistics import median
from typing import Callable

import attrs
from tqdm import tqdm

from graphc.runtime.grammar import Grammar

from . import contestants as C
from .env import environment
from .shapes import load_shape, weight_bytes

WORKLOADS = ("decode", "host", "exact", "prefix", "burst", "sampling", "chain", "grammar", "admission", "matmul")
GRAMMAR = r"[a-z]+( [a-z]+)*"  # unbounded, so grammar rows decode for the whole timed window
HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e, the roofline the docs quote
SAMPLING = {"temperature": 0.8, "top_p": 0.9, "top_k": 50}


@attrs.define
class BenchConfig:
    model: str = "tiny"
    dtype: str = "bfloat16"
    workloads: tuple = WORKLOADS
    batches: tuple = (1, 8, 32, 64)
    sampling_batches: tuple = (1, 16, 64)
    chain_batches: tuple = (1, 32)
    host_batches: tuple = (1, 64)
    grammar_batches: tuple = (16,)
    burst_requests: int = 32
    admission_batch: int = 16
    admission_len: int = 2048
    admission_chunk: int = 256
    matmul_batches: tuple = (1, 2, 4, 8, 16, 32, 64)
    prompt_len: int = 128
    warmup: int = 8
    steps: int = 32
    repeats: int = 5
    prefix_len: int = 2048
    prefix_requests: int = 32
    suffix_len: int = 32
    prefix_max_tokens: int = 8
    prefix_repeats: int = 2
    prefix_graph: str | None = None  # None: detect a graph with a prefix cache
    compile: bool | None = None  # None: measure compiled decode when the Engine offers it
    compile_ablation: bool = False  # also compiled decode without fused projections / without the kernel
    seed: int = 0
    progress: bool = True


@attrs.define
class Task:
    workload: str
    key: tuple  # (batch or case, contestant)
    label: str
    fn: Callable


def _prompts(n: int, length: int, vocab: int, rng: random.Random, prefix: list | None = None) -> list:
    head = prefix or []
    return [head + [rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


GRAPHS_PACKAGE = "graphc.graphs"  # the shipped graphs, package data


def _packaged_graphs() -> list[str]:
    try:
        return sorted(p.name[:-5] for p in resources.files(GRAPHS_PACKAGE).iterdir() if p.name.endswith(".yaml"))
    except Exception:
        return []


def _prefix_hits(model, tokenizer, config, graph, prompt_len: int) -> int:
    """Cached tokens reported for the second of two identical prompts through one Engine."""
    prompt = [[3 + (i * 7) % 200 for i in range(prompt_len)]]
    eng = C.make_engine(model, tokenizer, config, graph=graph)
    eng.generate(prompt, C.graphc_params(2))
    return eng.generate(prompt, C.graphc_params(2))[0].cached_tokens or 0


def find_prefix_graphs(model, tokenizer, config, prompt_len: int = 96) -> tuple:
    """(graph with the prefix cache on, graph with it off, why): a behavioural probe.

    "On" is the first of the default graph and the packaged ones under which a repeated
    prompt reports cached tokens; "off" is one that binds to the model and reports none
    (names with "noprefix" first). None stands for the default graph.
    """
    tried, on, off = [], None, None
    names = [None] + sorted(_packaged_graphs(), key=lambda n: "noprefix" not in n and "no_prefix" not in n)
    found_on = found_off = False
    for name in names:
        try:
            hit = _prefix_hits(model, tokenizer, config, name, prompt_len)
        except Exception as e:  # noqa: BLE001 - a graph that does not bind to this model
            tried.append(f"{name or 'default'}: {type(e).__name__}")
            continue
        tried.append(f"{name or 'default'}: {hit} of {prompt_len} cached on a repeat")
        if hit > 0 and not found_on:
            on, found_on = name, True
        if hit == 0 and not found_off:
            off, found_off = name, True
        if found_on and found_off:
            break
    why = "; ".join(tried)
    if not found_on:
        return None, None, "no graph serves a repeated prompt from a prefix cache (" + why + ")"
    if not found_off:
        return None, None, "every graph caches prefixes; no cache-off graph to compare with (" + why + ")"
    return (on or "default"), (off or "default"), why


def sampling_supported(model, tokenizer, config) -> str | None:
    """None when the engine samples; otherwise why not (the draw came back equal to greedy)."""
    try:
        eng = C.make_engine(model, tokenizer, config)
        p = [[5, 6, 7, 8]]
        greedy = eng.generate(p, C.graphc_params(8))[0].token_ids
        hot = eng.generate(p, C.graphc_params(8, {"temperature": 50.0, "seed": 1}))[0].token_ids
    except Exception as e:  # noqa: BLE001 - any failure means "not usable yet"
        return f"engine sampling failed: {type(e).__name__}: {e}"
    if hot == greedy:
        return "the engine ignores temperature (sampling not integrated yet): greedy tokens at temperature 50"
    return None


def run_bench(cfg: BenchConfig, log: Callable[[str], None] = print) -> dict:
    t_start = time.time()
    env = environment()
    model, tokenizer, config, label = load_shape(cfg.model, cfg.dtype, cfg.seed)
    vocab = int(config["vocab_size"])
    wbytes = weight_bytes(model)
    rng = random.Random(cfg.seed)
    notes: list[str] = []
    opts = C.engine_options()
    use_compile = ("compile" in opts) if cfg.compile is None else cfg.compile
    if cfg.compile is None and not use_compile:
        notes.append("compiled decode: the Engine has no `compile` option; graphc+compile columns skipped")
    compiled = {}
    if use_compile:
        compiled = C.compiled_info(model, tokenizer, config)
        notes.append(f"graphc+compile: {compiled['fused_layers']} llama blocks with fused q/k/v and gate/up; "
                     f"ragged decode-attention kernel {compiled['ragged_kernel']}; "
                     f"skinny matmul kernel (graphc+compile+skinny) {compiled['skinny_gemm']}")
    W, N, R = cfg.warmup, cfg.steps, cfg.repeats
    mm = dict(model=model, tokenizer=tokenizer, config=config)
    tasks: list[Task] = []
    wl = set(cfg.workloads)

    def add(workload, key, label_, fn):
        tasks.append(Task(workload, key, label_, fn))

    if "decode" in wl:
        for B in cfg.batches:
            ps = _prompts(B, cfg.prompt_len, vocab, rng)
            add("decode", (B, "plain"), f"decode B={B} plain",
                lambda ps=ps: C.plain_decode(model, ps, warmup=W, steps=N, repeats=R))
            add("decode", (B, "batchgen"), f"decode B={B} BatchGenerator",
                lambda ps=ps: C.batchgen_decode(model, ps, warmup=W, steps=N, repeats=R))
            add("decode", (B, "graphc"), f"decode B={B} graphc",
                lambda ps=ps: C.graphc_decode(**mm, prompts=ps, warmup=W, steps=N, repeats=R))
            if use_compile:
                add("decode", (B, "graphc_compiled"), f"decode B={B} graphc+compile",
                    lambda ps=ps: C.graphc_decode(**mm, prompts=ps, warmup=W, steps=N, repeats=R, compile=True))
            if use_compile and compiled.get("skinny_gemm") == "on":
                add("decode", (B, "compiled_skinny"), f"decode B={B} graphc+compile+skinny",
                    lambda ps=ps: C.graphc_decode(**mm, prompts=ps, warmup=W, steps=N, repeats=R,
                                                  compile=True, skinny_gemm=True))
            if use_compile and cfg.compile_ablation:
                for name, ev in (("compiled_nofuse", {"fuse_projections": False}),
                                  ("compiled_nokernel", {"attention_kernel": False}),
                                  ("compiled_nokvwrite", {"kv_write_kernel": False}),
                                  ("compiled_noaddmm", {"residual_matmul": False})):
                    add("decode", (B, name), f"decode B={B} graphc+compile ({name})",
                        lambda ps=ps, ev=ev: C.graphc_decode(**mm, prompts=ps, warmup=W, steps=N, repeats=R,
                                                               compile=True, decode_options=ev))
    if "host" in wl:
        for B in cfg.host_batches:
            ps = _prompts(B, cfg.prompt_len, vocab, rng)
            add("host", (B, "plain"), f"host B={B} plain", lambda ps=ps: C.plain_host(model, ps, warmup=W, steps=N))
            add("host", (B, "graphc"), f"host B={B} graphc",
                lambda ps=ps: C.graphc_host(**mm, prompts=ps, warmup=W, steps=N))
            if use_compile:
                add("host", (B, "graphc_compiled"), f"host B={B} graphc+compile",
                    lambda ps=ps: C.graphc_host(**mm, prompts=ps, warmup=W, steps=N, compile=True))
    if "exact" in wl and use_compile:
        B = max(cfg.chain_batches)
        ps = _prompts(B, cfg.prompt_len, vocab, rng)
        add("exact", (B, "check"), f"exact B={B} compiled vs uncompiled",
            lambda ps=ps: C.graphc_exact(**mm, prompts=ps, max_tokens=max(8, cfg.steps)))
    if "prefix" in wl:
        if cfg.prefix_graph:
            graph, off_graph, why = cfg.prefix_graph, "dense_noprefix", "given"
        else:
            graph, off_graph, why = find_prefix_graphs(model, tokenizer, config)
        if graph is None:
            notes.append(f"prefix: rows skipped — {why}; pass --prefix-graph NAME to force one")
        else:
            on_g = None if graph == "default" else graph
            off_g = None if off_graph == "default" else off_graph
            n = cfg.prefix_requests
            for r in range(cfg.prefix_repeats):
                # Each repeat: a fresh prefix (a warm-up run with another prefix JITs the kernels first).
                warm = _prompts(n, cfg.suffix_len, vocab, rng, _prompts(1, cfg.prefix_len, vocab, rng)[0])
                ps = _prompts(n, cfg.suffix_len, vocab, rng, _prompts(1, cfg.prefix_len, vocab, rng)[0])
                M = cfg.prefix_max_tokens
                add("prefix", (r, "batchgen"), f"prefix #{r} BatchGenerator",
                    lambda ps=ps, warm=warm: (C.batchgen_prefix(model, warm[:4], M), C.batchgen_prefix(model, ps, M))[1])
                add("prefix", (r, "graphc_off"), f"prefix #{r} graphc, cache off",
                    lambda ps=ps, warm=warm: (C.graphc_prefix(**mm, prompts=warm[:4], max_tokens=M, graph=off_g),
                                              C.graphc_prefix(**mm, prompts=ps, max_tokens=M, graph=off_g))[1])
                add("prefix", (r, "graphc_on"), f"prefix #{r} graphc, cache on ({graph})",
                    lambda ps=ps, warm=warm: (C.graphc_prefix(**mm, prompts=warm[:4], max_tokens=M, graph=on_g),
                                              C.graphc_prefix(**mm, prompts=ps, max_tokens=M, graph=on_g))[1])
            notes.append(f"prefix: cache on = graph '{graph}', cache off = graph '{off_graph}' ({why})")
    if "burst" in wl:
        # A burst of short distinct prompts (no shared prefix): prefill batching, not caching.
        n = cfg.burst_requests
        for r in range(cfg.prefix_repeats):
            ps = _prompts(n, cfg.prompt_len, vocab, rng)
            warm = _prompts(4, cfg.prompt_len, vocab, rng)
            M = cfg.prefix_max_tokens
            add("burst", (r, "batchgen"), f"burst #{r} BatchGenerator",
                lambda ps=ps, warm=warm: (C.batchgen_prefix(model, warm, M), C.batchgen_prefix(model, ps, M))[1])
            for name, bp in (("graphc_batched", True), ("graphc_single", False)):
                add("burst", (r, name), f"burst #{r} graphc, batch_prefill={bp}",
                    lambda ps=ps, warm=warm, bp=bp: (
                        C.graphc_prefix(**mm, prompts=warm, max_tokens=M, batch_prefill=bp),
                        C.graphc_prefix(**mm, prompts=ps, max_tokens=M, batch_prefill=bp))[1])
    if "sampling" in wl:
        why = sampling_supported(model, tokenizer, config)
        if why:
            notes.append(f"sampling: rows skipped — {why}")
        else:
            for B in cfg.sampling_batches:
                ps = _prompts(B, cfg.prompt_len, vocab, rng)
                for name, s in (("greedy", None), ("sampled", SAMPLING)):
                    add("sampling", (B, f"batchgen_{name}"), f"sampling B={B} BatchGenerator {name}",
                        lambda ps=ps, s=s: C.batchgen_decode(model, ps, warmup=W, steps=N, repeats=R, sampling=s))
                    add("sampling", (B, f"graphc_{name}"), f"sampling B={B} graphc {name}",
                        lambda ps=ps, s=s: C.graphc_decode(**mm, prompts=ps, warmup=W, steps=N, repeats=R, sampling=s))
    if "chain" in wl:
        for B in cfg.chain_batches:
            ps = _prompts(B, cfg.prompt_len, vocab, rng)
            for chain in (True, False):
                name = "chained" if chain else "unchained"
                add("chain", (B, name), f"chain B={B} {name}",
                    lambda ps=ps, chain=chain: C.graphc_decode(**mm, prompts=ps, warmup=W, steps=N, repeats=R,
                                                               chain=chain))
    if "grammar" in wl:
        tok = C.text_tokenizer(tokenizer)
        for B in cfg.grammar_batches:
            ps = _prompts(B, cfg.prompt_len, vocab, rng)
            for name, s in (("greedy", None), ("grammar", {"grammar": Grammar.regex(GRAMMAR)})):
                add("grammar", (B, name), f"grammar B={B} {name}",
                    lambda ps=ps, s=s: C.graphc_decode(model, tok, config, prompts=ps, warmup=W, steps=N,
                                                       repeats=R, sampling=s))
    if "admission" in wl:
        B = cfg.admission_batch
        ps = _prompts(B, cfg.prompt_len, vocab, rng)
        long_prompt = _prompts(1, cfg.admission_len, vocab, rng)[0]
        add("admission", (B, "graphc"), f"admission of a {cfg.admission_len}-token prompt while {B} decode",
            lambda: C.graphc_admission(**mm, prompts=ps, long_prompt=long_prompt, warmup=W, steps=N,
                                       prefill_chunk=cfg.admission_chunk))
    if "matmul" in wl:
        if env["backend"] == "cpu" and "matmul" not in _explicit(cfg):
            notes.append("matmul: skipped on CPU — it measures MLX's GPU matmul (pass --workloads matmul to force)")
        else:
            for (K, Nn), what in _matmul_shapes(config):
                add("matmul", ((K, Nn), what), f"matmul {what} {K}->{Nn}",
                    lambda K=K, Nn=Nn: C.matmul_rows(K, Nn, cfg.matmul_batches))

    raw: dict = {}
    bar = _progress(len(tasks), cfg.progress)
    for t in tasks:
        bar.set_description(t.label)
        try:
            raw[(t.workload,) + t.key] = res = t.fn()
            log(f"[bench] {t.label}: {_brief(res)}")
        except NotImplementedError as e:
            raw[(t.workload,) + t.key] = None
            notes.append(f"{t.workload}: {t.label} skipped — {e}")
        except Exception as e:  # noqa: BLE001 - one broken measurement must not lose the others
            raw[(t.workload,) + t.key] = None
            notes.append(f"{t.workload}: {t.label} FAILED — {type(e).__name__}: {e}")
            log(f"[bench] {t.label}: FAILED {type(e).__name__}: {e}")
        bar.update(1)
    bar.close()

    rows = _rows(raw, cfg, wbytes, env)
    return {
        "config": attrs.asdict(cfg),
        "model": {"name": label, "weight_bytes": wbytes, "dtype": cfg.dtype,
                  "layers": config.get("num_hidden_layers"), "hidden": config.get("hidden_size"),
                  "hbm_roofline_ms": wbytes / HBM_BYTES_PER_S * 1e3},
        "environment": env,
        "compiled_decode": compiled,
        "rows": rows,
        "notes": notes,
        "elapsed_s": time.time() - t_start,
    }


def _brief(res) -> str:
    """One line per finished measurement, printed as the bench goes (a killed run keeps them)."""
    if isinstance(res, list) and res and isinstance(res[0], (int, float)):
        return f"median {median(res):.3f} ms/step, windows {[round(x, 3) for x in res]}"
    if isinstance(res, list):
        return f"{len(res)} rows"
    return str({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()})


def _explicit(cfg) -> tuple:
    return cfg.workloads if tuple(cfg.workloads) != WORKLOADS else ()


def _matmul_shapes(config) -> list:
    h, i = config["hidden_size"], config["intermediate_size"]
    hd = config.get("head_dim") or h // config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or config["num_attention_heads"]
    nq = config["num_attention_heads"] * hd
    return [((h, i), "mlp up/gate"), ((i, h), "mlp down"), ((h, nq), "q proj"), ((nq, h), "o proj"),
            ((h, kv * hd), "k/v proj"), ((h, config["vocab_size"]), "lm head"),
            ((h, nq + 2 * kv * hd), "fused qkv"), ((h, 2 * i), "fused gate+up")]


class _NoBar:
    def set_description(self, s):
        pass

    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, on: bool):
    if not on:
        return _NoBar()
    return tqdm(total=total, unit="run", dynamic_ncols=True, leave=False)


# -- rows -----------------------------------------------------------------------------------
def _ratio(a, b):
    if a is None or b is None or not b or not math.isfinite(a) or not math.isfinite(b):
        return None
    return a / b


def _rows(raw: dict, cfg: BenchConfig, wbytes: int, env: dict) -> list[dict]:
    rows = []
    roof = wbytes / HBM_BYTES_PER_S * 1e3

    def tps(key, B):
        v = raw.get(key)
        return None if not v else B * 1e3 / median(v)

    def ms(key):
        v = raw.get(key)
        return None if not v else median(v)

    for B in cfg.batches if "decode" in cfg.workloads else ():
        names = ("graphc", "graphc_compiled", "compiled_skinny", "compiled_nofuse", "compiled_nokernel",
                 "compiled_nokvwrite", "compiled_noaddmm", "batchgen", "plain")
        vals = {n: tps(("decode", B, n), B) for n in names if raw.get(("decode", B, n))}
        steps = {n: ms(("decode", B, n)) for n in vals}
        best = min(steps.get(n, math.inf) for n in ("graphc", "graphc_compiled", "compiled_skinny"))
        rows.append({
            "workload": "decode", "case": f"B={B}", "batch": B, "unit": "tok/s", "values": vals,
            "ms_per_step": steps,
            "ratios": _drop_none({
                "graphc/batchgen": _ratio(vals.get("graphc"), vals.get("batchgen")),
                "graphc/plain": _ratio(vals.get("graphc"), vals.get("plain")),
                "compiled/batchgen": _ratio(vals.get("graphc_compiled"), vals.get("batchgen")),
                "compiled/plain": _ratio(vals.get("graphc_compiled"), vals.get("plain")),
                "compiled/graphc": _ratio(vals.get("graphc_compiled"), vals.get("graphc")),
                "skinny/batchgen": _ratio(vals.get("compiled_skinny"), vals.get("batchgen")),
                "skinny/plain": _ratio(vals.get("compiled_skinny"), vals.get("plain")),
                "skinny/compiled": _ratio(vals.get("compiled_skinny"), vals.get("graphc_compiled")),
                "nofuse/graphc": _ratio(vals.get("compiled_nofuse"), vals.get("graphc")),
                "nokernel/graphc": _ratio(vals.get("compiled_nokernel"), vals.get("graphc")),
                "compiled/nokvwrite": _ratio(vals.get("graphc_compiled"), vals.get("compiled_nokvwrite")),
                "compiled/noaddmm": _ratio(vals.get("graphc_compiled"), vals.get("compiled_noaddmm")),
            }),
            "hbm_roofline_ms": roof,
            # The HBM roofline is an H200 number: on other devices the gap means nothing.
            "roofline_gap": (best / roof) if math.isfinite(best) and env["backend"] == "cuda" else None,
            "windows_ms": {n: raw[("decode", B, n)] for n in vals},
        })
    for B in cfg.host_batches if "host" in cfg.workloads else ():
        vals = {n: raw[("host", B, n)] for n in ("graphc", "graphc_compiled", "plain") if raw.get(("host", B, n))}
        rows.append({
            "workload": "host", "case": f"B={B}", "batch": B, "unit": "ms (build / device)",
            "values": {n: v["build_ms"] for n, v in vals.items()}, "detail": vals,
            "ratios": _drop_none({f"{n} build/device": _ratio(v["build_ms"], v["device_ms"]) for n, v in vals.items()}
                                 | {"compiled/graphc build": _ratio(vals.get("graphc_compiled", {}).get("build_ms"),
                                                                    vals.get("graphc", {}).get("build_ms"))}),
        })
    for k in (k for k in raw if k[0] == "exact" and raw[k]):
        e = raw[k]
        rows.append({"workload": "exact", "case": f"B={k[1]}", "batch": k[1], "unit": "rows identical",
                     "values": {"identical rows": e["identical_rows"], "rows": e["rows"]},
                     "detail": e, "ratios": {"token prefix match": e["prefix_match"]}})
    prefix = [k for k in raw if k[0] == "prefix" and raw[k]]
    if prefix:
        reps = sorted({k[1] for k in prefix})

        def agg(name, field):
            xs = [raw[("prefix", r, name)][field] for r in reps if raw.get(("prefix", r, name))]
            return median(xs) if xs else None

        for field, unit, lower in (("ttft_median_ms", "TTFT ms (median)", True),
                                   ("ttft_mean_ms", "TTFT ms (mean)", True),
                                   ("tok_per_s", "generated tok/s", False)):
            vals = _drop_none({n: agg(n, field) for n in ("graphc_on", "graphc_off", "batchgen")})
            r = (lambda a, b: _ratio(b, a)) if lower else _ratio
            rows.append({
                "workload": "prefix", "case": f"{cfg.prefix_requests}x{cfg.prefix_len}+{cfg.suffix_len}",
                "batch": cfg.prefix_requests, "unit": unit, "values": vals,
                "ratios": _drop_none({"cache on/off": r(vals.get("graphc_on"), vals.get("graphc_off")),
                                      "graphc on/batchgen": r(vals.get("graphc_on"), vals.get("batchgen")),
                                      "graphc off/batchgen": r(vals.get("graphc_off"), vals.get("batchgen"))}),
                "lower_is_better": lower,
                "cached_tokens": agg("graphc_on", "cached_tokens"),
            })
    burst = [k for k in raw if k[0] == "burst" and raw[k]]
    if burst:
        reps = sorted({k[1] for k in burst})

        def bagg(name, field):
            xs = [raw[("burst", r, name)][field] for r in reps if raw.get(("burst", r, name))]
            return median(xs) if xs else None

        for field, unit, lower in (("ttft_median_ms", "TTFT ms (median)", True), ("tok_per_s", "generated tok/s", False)):
            vals = _drop_none({n: bagg(n, field) for n in ("graphc_batched", "graphc_single", "batchgen")})
            r = (lambda a, b: _ratio(b, a)) if lower else _ratio
            rows.append({
                "workload": "burst", "case": f"{cfg.burst_requests}x{cfg.prompt_len}", "batch": cfg.burst_requests,
                "unit": unit, "values": vals, "lower_is_better": lower,
                "ratios": _drop_none({"batched/single": r(vals.get("graphc_batched"), vals.get("graphc_single")),
                                      "batched/batchgen": r(vals.get("graphc_batched"), vals.get("batchgen"))}),
            })
    for B in cfg.sampling_batches if "sampling" in cfg.workloads else ():
        names = ("graphc_greedy", "graphc_sampled", "batchgen_greedy", "batchgen_sampled")
        vals = {n: tps(("sampling", B, n), B) for n in names if raw.get(("sampling", B, n))}
        if not vals:
            continue
        rows.append({
            "workload": "sampling", "case": f"B={B}", "batch": B, "unit": "tok/s", "values": vals,
            "ratios": _drop_none({
                "graphc/batchgen sampled": _ratio(vals.get("graphc_sampled"), vals.get("batchgen_sampled")),
                "graphc sampled/greedy": _ratio(vals.get("graphc_sampled"), vals.get("graphc_greedy")),
                "batchgen sampled/greedy": _ratio(vals.get("batchgen_sampled"), vals.get("batchgen_greedy")),
            }),
        })
    for B in cfg.chain_batches if "chain" in cfg.workloads else ():
        vals = {n: tps(("chain", B, n), B) for n in ("chained", "unchained") if raw.get(("chain", B, n))}
        if vals:
            rows.append({"workload": "chain", "case": f"B={B}", "batch": B, "unit": "tok/s", "values": vals,
                         "ratios": _drop_none({"chained/unchained": _ratio(vals.get("chained"), vals.get("unchained"))})})
    for B in cfg.grammar_batches if "grammar" in cfg.workloads else ():
        vals = {n: tps(("grammar", B, n), B) for n in ("greedy", "grammar") if raw.get(("grammar", B, n))}
        if vals:
            rows.append({"workload": "grammar", "case": f"B={B}", "batch": B, "unit": "tok/s", "values": vals,
                         "ratios": _drop_none({"grammar/greedy": _ratio(vals.get("grammar"), vals.get("greedy"))})})
    for k in (k for k in raw if k[0] == "admission" and raw[k]):
        a = raw[k]
        rows.append({"workload": "admission", "case": f"{cfg.admission_len} tokens, chunk {cfg.admission_chunk}, B={k[1]}",
                     "batch": k[1], "unit": "ms/step of the running rows",
                     "values": {"steady": a["steady_ms"], "during": a["during_ms"], "max": a["max_ms"],
                                "steps": a["steps"]},
                     "ratios": {"during/steady": a["during_ms"] / a["steady_ms"]}})
    for k in (k for k in raw if k[0] == "matmul" and raw[k]):
        (K, Nn), what = k[1], k[2]
        for r in raw[k]:
            who = "graphc" if r["variant"] == "skinny" else "mlx"  # graphc's kernel or MLX's matmul
            rows.append({"workload": "matmul", "case": f"{what} {K}->{Nn} B={r['B']} {r['variant']}",
                         "batch": r["B"], "unit": "GB/s (weights)", "values": {who: r["GBps"], "us": r["us"]},
                         "ratios": {"of HBM peak": r["GBps"] * 1e9 / HBM_BYTES_PER_S}})
    return rows


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}
