"""`graphc bench --agent-replay`: a growing multi-turn conversation replayed turn by turn against
graphc serve and mlx_lm.server; time to first token per turn, cached vs cold, in memory, with
graphc's disk tier, and after a restart. See docs/agent-replay.md.

The conversation is a replay (as of a recorded agent trace): turn k's prompt is the first
L_k tokens of one text, L_k growing evenly to --replay-context; the servers' answers are not
appended, so both servers get the same prompts. Each turn is one streamed /v1/completions
request of one greedy token (its latency is the time to first token: prefill + one step), sent
after the previous one finished.

Per repeat, on fresh server processes (the restart is a new process on the same folder):

- cold:    every turn with a text of its own (same lengths, nothing shared): no cache can help.
- warm:    the replay on the same server after the cold pass: each turn reuses the previous prompt.
- disk:    graphc with --kv-cache-dir on a fresh folder: the replay (it also writes the folder).
- restart: the conversation goes on after a restart: a process replays every turn but the last
           (graphc: with --kv-cache-dir on a second fresh folder) and stops; a new process
           (graphc: on that folder) gets the last turn first. So the restart reuses what the
           earlier process wrote and computes the new turn, as a growing conversation would; the
           turns before it would hit the new process's own memory cache and say nothing about
           the restart. mlx_lm.server keeps no cache across processes: its restart is a cold turn.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .serving.http import httpx, require
from tokenizers import Tokenizer

from .env import describe, environment
from .report import write_json
from .serving.servers import SERVERS, Server, free_port
from .serving.workload import Request, corpus_ids, eos_token_ids

PASSES = ("cold", "warm", "disk", "restart")


@dataclass
class ReplayConfig:
    model: str
    context: int = 4096  # tokens of the last turn
    turns: int = 8
    max_tokens: int = 1  # 1: the request's latency is its time to first token
    repeats: int = 3
    servers: tuple = ("graphc", "mlx_lm")
    graphc_args: tuple = ()
    mlx_args: tuple = ()
    log_dir: str = "agent-replay-logs"
    seed: int = 0
    passes: tuple = PASSES  # which to run; "cold" always runs (the others are ratios to it)
    gap: float = 0.0  # seconds between a turn's answer and the next turn (untimed)


def conversation(model: str, context: int, turns: int, seed: int) -> tuple[list[Request], list[Request]]:
    """(replay, cold): turn k of the replay is a prefix of turn k+1; the cold turns have the same
    lengths, each cut from its own place in the corpus."""
    tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    ids = corpus_ids(tok)
    while len(ids) < context * (turns + 2):
        ids = ids + ids
    rng = random.Random(seed)
    lengths = [max(16, context * (k + 1) // turns) for k in range(turns)]

    def req(start: int, n: int) -> Request:
        text = tok.decode(ids[start:start + n])
        return Request(text, len(tok.encode(text, add_special_tokens=False).ids), 0)

    base = rng.randrange(len(ids) - context)
    starts = rng.sample(range(0, len(ids) - context, max(1, context // 4)), turns)
    return [req(base, n) for n in lengths], [req(s, n) for s, n in zip(starts, lengths)]


def replay(url: str, reqs: list[Request], max_tokens: int, body: dict, engine: list | None = None,
           gap: float = 0.0) -> list[float]:
    """Time to first token of each turn in seconds, one turn after the other: the latency of a
    one-token request (prefill + one step), timed the same way on both servers: streamed first
    chunks are no measure here, as random-weight models often emit tokens whose text is empty.
    `engine`: a list that gets each turn's TTFT on the engine's clock (graphc's /metrics, scraped
    between turns, outside the timed request), so a turn's time splits into engine and door.
    `gap`: seconds waited before every turn but the first (an agent's tool call), untimed."""
    out = []
    with httpx.Client(timeout=600) as client:
        for i, r in enumerate(reqs):
            if gap > 0 and i:
                time.sleep(gap)
            before = engine_ttft_total(client, url) if engine is not None else None
            t0 = time.perf_counter()
            resp = client.post(url + "/v1/completions", json={"prompt": r.prompt, "max_tokens": max_tokens,
                                                               "temperature": 0.0, **body})
            dt = time.perf_counter() - t0
            if resp.status_code != 200:
                raise RuntimeError(f"turn of {r.prompt_tokens} tokens: HTTP {resp.status_code}: {resp.text[:200]}")
            out.append(dt)
            if engine is not None:
                after = engine_ttft_total(client, url)
                engine.append(None if before is None or after is None else after - before)
    return out


_TTFT_SUM = re.compile(r"^graphc_request_ttft_seconds_sum(?:\{[^}]*\})? (\S+)$")


def engine_ttft_total(client, url: str) -> float | None:
    """The sum of every request's TTFT on graphc's engine clock so far (its histogram's `_sum`, over
    the server's models), or None from a server without it."""
    try:
        text = client.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    vals = [float(m.group(1)) for m in map(_TTFT_SUM.match, text.splitlines()) if m]
    return sum(vals) if vals else None


# What a restarted graphc did with its disk hit (runtime/cache/disk_choice.py): its /metrics counters
# after the turn, so a restart's TTFT can be told apart as a read or a recompute.
DISK_COUNTERS = ("graphc_prefix_cache_disk_choices_total", "graphc_prefix_cache_disk_recomputed_tokens_total",
                 "graphc_prefix_cache_disk_hit_tokens_total", "graphc_prefix_cache_disk_read_bytes_per_second",
                 "graphc_prefix_cache_disk_prefill_tokens_per_second")


def disk_counters(url: str) -> dict:
    """The disk tier's counters from graphc's /metrics ({} from a server without them), keyed by
    name and labels as written (e.g. 'graphc_prefix_cache_disk_choices_total{choice="read"}')."""
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    return parse_disk_counters(text)


def parse_disk_counters(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if line.startswith(DISK_COUNTERS):
            name, _, value = line.rpartition(" ")
            out[re.sub(r'model="[^"]*",?', "", name).replace("{}", "")] = float(value)
    return out


def run_replay(cfg: ReplayConfig, log=print) -> dict:
    turns, cold_turns = conversation(cfg.model, cfg.context, cfg.turns, cfg.seed)
    warm = [Request("warm up the kernels", 4, 0)]
    eos = eos_token_ids(cfg.model)
    env = environment()
    log(f"agent replay: {describe(env)}; {cfg.turns} turns to {turns[-1].prompt_tokens} tokens, "
        f"{cfg.max_tokens} new tokens per turn, {cfg.repeats} repeats"
        + (f", {cfg.gap:g} s between turns" if cfg.gap > 0 else ""))
    runs = []  # {server, repeat, pass, ttft: [per turn]}
    logs = Path(cfg.log_dir)
    for rep in range(cfg.repeats):
        order = [s for s in SERVERS if s.name in cfg.servers]
        order = order if rep % 2 == 0 else order[::-1]  # alternate who goes first: drift hits both
        for spec in order:
            body = spec.fixed_length_body(eos)
            extra = list(cfg.graphc_args if spec.name == "graphc" else cfg.mlx_args)
            eng: list = []

            def start(more=()):
                return Server(spec, cfg.model, free_port(), 1, logs / f"{spec.name}.log", extra + list(more))

            def timed(url, reqs):  # TTFT per turn; graphc's engine-side TTFT beside it in `eng`
                eng.clear()
                return replay(url, reqs, cfg.max_tokens, body, eng if spec.name == "graphc" else None, cfg.gap)

            def record(pass_, ttft):
                runs.append({"server": spec.name, "repeat": rep, "pass": pass_, "ttft": ttft})
                line = " ".join(f"{t * 1e3:.0f}" for t in ttft)
                if eng and all(e is not None for e in eng):
                    runs[-1]["engine_ttft"] = list(eng)
                    line += " ms; in the engine " + " ".join(f"{e * 1e3:.0f}" for e in eng)
                log(f"  repeat {rep + 1} {spec.name:7s} {pass_:8s}: TTFT per turn {line} ms")

            with start() as url:  # cold, then warm, on one process
                replay(url, warm, 2, body)
                record("cold", timed(url, cold_turns))
                if "warm" in cfg.passes:
                    record("warm", timed(url, turns))
            with tempfile.TemporaryDirectory(prefix="graphc-kv-") as folder:
                disk = ("--kv-cache-dir", folder) if spec.name == "graphc" and "disk" in cfg.passes else ()
                if disk:
                    with start(disk) as url:
                        replay(url, warm, 2, body)
                        record("disk", timed(url, turns))
            if "restart" not in cfg.passes:
                continue
            with tempfile.TemporaryDirectory(prefix="graphc-kv-") as folder:
                disk = ("--kv-cache-dir", folder) if spec.name == "graphc" else ()
                if disk:  # the conversation up to its last turn, on a process that then stops
                    with start(disk) as url:
                        replay(url, turns[:-1], cfg.max_tokens, body)
                with start(disk) as url:  # the restart: a new process (graphc: on that folder)
                    replay(url, warm, 1, body)
                    record("restart", timed(url, turns[-1:]))
                    if disk:
                        runs[-1]["disk"] = disk_counters(url)
                        log(f"  repeat {rep + 1} {spec.name:7s} restart : the disk tier's counters "
                            + json.dumps(runs[-1]["disk"]))
    return {"kind": "agent_replay", "environment": env, "config": asdict(cfg),
            "turn_tokens": [r.prompt_tokens for r in turns], "runs": runs, "summary": summarize(runs, cfg)}


def _spread(xs: list) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize(runs: list, cfg: ReplayConfig) -> dict:
    """Per server and pass: per turn the median TTFT over repeats (min / max), and per repeat the
    ratio to that repeat's cold pass of the last turn and of turns 2.. summed, as spreads."""
    out = {}
    for server in cfg.servers:
        cold = {r["repeat"]: r["ttft"] for r in runs if r["server"] == server and r["pass"] == "cold"}
        for p in PASSES:
            mine = [r for r in runs if r["server"] == server and r["pass"] == p]
            if not mine:
                continue
            n = len(mine[0]["ttft"])  # the last n turns (restart: the last one)
            per_turn = [None] * (cfg.turns - n) + [_spread([r["ttft"][k] for r in mine]) for k in range(n)]
            ratios = [sum(r["ttft"][1:]) / sum(cold[r["repeat"]][1:]) for r in mine if r["repeat"] in cold and n > 1]
            last = [r["ttft"][-1] / cold[r["repeat"]][-1] for r in mine if r["repeat"] in cold]
            out[f"{server}/{p}"] = {"per_turn": per_turn, "vs_cold_turns_2_on": _spread(ratios) if ratios else None,
                                    "vs_cold_last_turn": _spread(last) if last else None}
    return out


def table(result: dict) -> str:
    s, tokens = result["summary"], result["turn_tokens"]
    head = "| server / pass | " + " | ".join(f"turn {k + 1} ({n} tok)" for k, n in enumerate(tokens)) + \
           " | last turn / cold | turns 2.. / cold |"
    rows = [head, "|" + "---|" * (len(tokens) + 3)]
    for key, v in s.items():
        cells = [f"{c['median'] * 1e3:.0f} ({c['min'] * 1e3:.0f}-{c['max'] * 1e3:.0f})" if c else "-"
                 for c in v["per_turn"]]
        ratio = [f"{x['median']:.3f} ({x['min']:.3f}-{x['max']:.3f})" if x else "-"
                 for x in (v["vs_cold_last_turn"], v["vs_cold_turns_2_on"])]
        rows.append(f"| {key} | " + " | ".join(cells + ratio) + " |")
    return "TTFT ms, median over repeats (min-max)\n" + "\n".join(rows)


def cmd_agent_replay(args) -> int:
    require("--agent-replay")
    if not args.model or not (Path(args.model) / "config.json").exists():
        raise SystemExit("graphc bench --agent-replay: --model must be a model folder both servers can load "
                         "(make one with `graphc make-model` or benchmarks/serving/make_shape.py)")
    if args.replay_turns < 2 or args.replay_repeats < 1:
        raise SystemExit("graphc bench --agent-replay: --replay-turns must be >= 2 and --replay-repeats >= 1")
    if not args.replay_gap >= 0:
        raise SystemExit(f"graphc bench --agent-replay: --replay-gap must be >= 0 seconds (got {args.replay_gap})")
    limit = json.loads((Path(args.model) / "config.json").read_text()).get("max_position_embeddings")
    if isinstance(limit, int) and args.replay_context + args.replay_max_tokens > limit:
        raise SystemExit(f"graphc bench --agent-replay: --replay-context {args.replay_context} + "
                         f"--replay-max-tokens {args.replay_max_tokens} exceed the model's context ({limit} tokens, "
                         "max_position_embeddings in its config.json): the servers would refuse the last turns")
    servers = tuple(s for s in args.servers.split(",") if s)
    passes = tuple(p for p in args.replay_passes.split(",") if p)
    unknown = sorted(set(passes) - set(PASSES))
    if unknown:
        raise SystemExit(f"graphc bench --agent-replay: --replay-passes: unknown {', '.join(unknown)} "
                         f"(choose from {', '.join(PASSES)})")
    cfg = ReplayConfig(model=args.model, context=args.replay_context, turns=args.replay_turns,
                       max_tokens=args.replay_max_tokens, repeats=args.replay_repeats, servers=servers,
                       graphc_args=tuple(args.graphc_args.split()), mlx_args=tuple(args.mlx_args.split()),
                       log_dir=args.log_dir, seed=args.seed, gap=args.replay_gap,
                       passes=tuple(p for p in PASSES if p in passes or p == "cold"))
    result = run_replay(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
    result["command"] = "graphc " + " ".join(sys.argv[1:])
    print(table(result))
    if args.json_out:
        write_json(result, args.json_out)
    return 0
