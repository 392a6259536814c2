"""Tensor-parallel serving over mx.distributed (runtime/distributed/), on CPU with the ring backend
over loopback: 2 ranks, one process each.

Default run: greedy parity of a 2-way engine with the single-process one (llama, qwen3, and
gpt_oss for a MoE), launched with `mlx.launch` as docs/distributed.md says; a served request
through the OpenAI client, then a follower killed mid-stream: the client gets an error and
rank 0 exits 1 with the reason. `-m slow`: rank 0 killed, and hung ranks (SIGSTOP) caught by
the watchdog. Plus in-process checks of the plan format and of what is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphc.runtime import Engine, SamplingParams

HERE = Path(__file__).parent
WORKER = HERE / "distributed_worker.py"
LAUNCH = [sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()"]
GRAPHC = shutil.which("graphc") or str(Path(sys.executable).parent / "graphc")

# Rows: greedy over several prefill chunks, greedy, seeded sampling, a regex grammar (host
# masks, the chain broken), and unseeded sampling (the runner key rank 0 shares) last.
PROMPTS = [list(range(5, 22)), [40, 41, 42], [100, 200, 300, 400, 500], [50, 51], [7, 8, 9, 10, 11, 12]]
PARAMS = [{"max_tokens": 12}, {"max_tokens": 7}, {"max_tokens": 10, "temperature": 0.8, "seed": 3},
          {"max_tokens": 8, "grammar": {"type": "regex", "pattern": "[a-z ]+"}},
          {"max_tokens": 9, "temperature": 1.0, "ignore_eos": True}]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _launch(*argv, attempts: int = 3) -> subprocess.CompletedProcess:
    """`mlx.launch -n 2 --backend ring -p PORT argv...`, retried on a fresh port when a port was
    taken between choosing it and binding it (the ring binds PORT and the ports after it)."""
    for _ in range(attempts):
        run = subprocess.run([*LAUNCH, "-n", "2", "--backend", "ring", "-p", str(_free_ports(1)[0]), *argv],
                             capture_output=True, text=True, timeout=300)
        if "Couldn't bind socket" not in run.stderr:
            break
    return run


def _spawn_ranks(tmp_path, argv, n: int = 2, env: dict | None = None) -> list[subprocess.Popen]:
    """What mlx.launch --backend ring does on one host, done by hand so a test can signal one rank.
    `argv`: the command of every rank, or a function of the rank giving each its own."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in _free_ports(n)]))
    procs = []
    for rank in range(n):
        e = {**os.environ, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile), **(env or {})}
        cmd = argv(rank) if callable(argv) else argv
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    return procs


def _end(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate()


def _wait_exit(p: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        pytest.fail(f"rank did not exit within {timeout} s; stderr:\n{err[-3000:]}")
    return p.returncode, err


# -- 2-way tensor parallel equals one process ------------------------------------------------
def test_two_ranks_match_one_process(model_dir, tmp_path):
    models = [str(model_dir("llama")), str(model_dir("qwen3")), str(model_dir("gpt_oss"))]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"models": models, "engine": {"prefill_chunk": 8}, "prompts": PROMPTS,
                                "params": PARAMS}))
    out = tmp_path / "out.json"
    run = _launch(sys.executable, str(WORKER), str(out), str(spec))
    assert out.exists(), f"rank 0 wrote no results (launcher exit {run.returncode}):\n{run.stderr[-4000:]}"
    assert "exited with code" not in run.stderr, run.stderr[-4000:]
    got = json.loads(out.read_text())
    for m in models:
        ref = Engine.load(m, prefill_chunk=8).generate(PROMPTS, [SamplingParams(**p) for p in PARAMS])
        tp = got[m]
        for i in range(4):  # greedy, seeded and grammar rows: the same tokens as one process
            assert tp["tokens"][i] == ref[i].token_ids, (Path(m).name, i)
            assert tp["again"][i] == ref[i].token_ids, (Path(m).name, i, "from the prefix cache")
        # The unseeded row draws from another key than the single process did; that both ranks
        # drew the same tokens is what their per-step digests checked (a mismatch exits 1).
        assert len(tp["tokens"][4]) == PARAMS[4]["max_tokens"]
        if Path(m).name.startswith("model-llama"):  # dense graph: pool-backed prefix cache
            assert sum(tp["cached_tokens"]) > 0, tp["cached_tokens"]


def test_two_ranks_compiled_decode_match_one_process(model_dir, tmp_path):
    """compile=True under tensor parallelism: the decode forward is traced through the sharded
    layers (their all_sums inside the trace); the tokens are the single eager process's."""
    m = str(model_dir("llama"))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"models": [m], "engine": {"prefill_chunk": 8, "compile": True},
                                "prompts": PROMPTS[:4], "params": PARAMS[:4]}))
    out = tmp_path / "out.json"
    run = _launch(sys.executable, str(WORKER), str(out), str(spec))
    assert out.exists(), f"rank 0 wrote no results (launcher exit {run.returncode}):\n{run.stderr[-4000:]}"
    ref = Engine.load(m, prefill_chunk=8).generate(PROMPTS[:4], [SamplingParams(**p) for p in PARAMS[:4]])
    got = json.loads(out.read_text())[m]
    assert got["tokens"] == [r.token_ids for r in ref]
    assert got["again"] == [r.token_ids for r in ref]


def test_sharded_compile_turns_projection_fusion_off():
    from graphc.runtime.distributed.load import _check_options

    kw = {"compile": True}
    _check_options(kw)
    assert kw["decode_options"] == {"fuse_projections": False}
    with pytest.raises(ValueError, match="fuse_projections"):
        _check_options({"compile": True, "decode_options": {"fuse_projections": True}})


def test_sharded_engines_take_no_timing_based_decisions():
    """Ranks replay rank 0's steps from the same state: a choice made by timing could differ."""
    from graphc.runtime.distributed.load import _check_options

    kw = {}
    _check_options(kw)
    assert kw["spec_adaptive"] is False
    with pytest.raises(ValueError, match="measured"):
        _check_options({"compile": "measured"})
    with pytest.raises(ValueError, match="spec_adaptive"):
        _check_options({"spec_adaptive": True})


def test_nccl_launch_turns_cuda_graphs_off(monkeypatch):
    from graphc.runtime.distributed.group import direct_launches_for_nccl

    monkeypatch.delenv("MLX_USE_CUDA_GRAPHS", raising=False)
    monkeypatch.delenv("NCCL_HOST_IP", raising=False)
    assert not direct_launches_for_nccl()  # not an NCCL launch: untouched
    assert "MLX_USE_CUDA_GRAPHS" not in os.environ
    monkeypatch.setenv("NCCL_HOST_IP", "127.0.0.1")
    assert direct_launches_for_nccl() and os.environ["MLX_USE_CUDA_GRAPHS"] == "0"
    monkeypatch.setenv("MLX_USE_CUDA_GRAPHS", "1")  # the user's choice wins
    assert not direct_launches_for_nccl() and os.environ["MLX_USE_CUDA_GRAPHS"] == "1"


# -- serving, and a follower that dies ---------------------------------------------------------
TIMEOUT_S = 10  # GRAPHC_DIST_TIMEOUT of the test servers: how long a hang may go unnoticed


def _serve_ranks(tmp_path, model: str, env: dict | None = None):
    port = _free_ports(1)[0]
    env = {"GRAPHC_DIST_TIMEOUT": str(TIMEOUT_S), **(env or {})}
    procs = _spawn_ranks(tmp_path, [GRAPHC, "serve", "--model", model, "--port", str(port),
                                    "--served-model-name", "tiny", "--log-level", "warning"], env=env)
    import httpx

    deadline = time.time() + 120
    while time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            errs = [p.communicate()[1] for p in procs]
            pytest.fail(f"a rank exited while starting: {[p.returncode for p in procs]}\n" + "\n".join(errs)[-4000:])
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return procs, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    _end(procs)
    pytest.fail("the 2-rank server did not come up in 120 s")


def test_served_request_then_follower_killed(model_dir, tmp_path):
    import openai

    model = str(model_dir("llama"))
    procs, url = _serve_ranks(tmp_path, model)
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0)
        [ref] = Engine.load(model).generate(["Once upon a time"], SamplingParams(max_tokens=12))
        assert r.choices[0].text == ref.text

        # A long stream; kill rank 1 once tokens flow: the client gets an error, not a stall.
        stream = client.completions.create(model="tiny", prompt="Once", max_tokens=4000, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        next(chunks)
        procs[1].send_signal(signal.SIGKILL)
        t0 = time.time()
        # A failed request, or the connection dropped: openai wraps the transport error in
        # APIConnectionError in some releases and lets httpx's RemoteProtocolError through in others.
        with pytest.raises(Exception) as failed:
            for _ in chunks:
                pass
        assert isinstance(failed.value, openai.APIError) or "ProtocolError" in type(failed.value).__name__, \
            repr(failed.value)
        assert time.time() - t0 < 3 * TIMEOUT_S, "the stream went on after its follower died"
        code, err = _wait_exit(procs[0], 3 * TIMEOUT_S)
        assert code == 1, err[-3000:]
        # Either the ring backend reported the lost peer, or it hung and the watchdog fired.
        assert "distributed group of 2 ranks failed" in err or "did not finish in" in err, err[-3000:]
    finally:
        _end(procs)


# -- slow: rank 0 dies; a rank hangs -------------------------------------------------------
@pytest.mark.slow
def test_leader_killed_ends_follower(model_dir, tmp_path):
    procs, _ = _serve_ranks(tmp_path, str(model_dir("llama")))
    try:
        procs[0].send_signal(signal.SIGKILL)
        code, err = _wait_exit(procs[1], 3 * TIMEOUT_S)
        assert code == 1 and ("lost rank 0" in err or "did not finish in" in err), err[-3000:]
    finally:
        _end(procs)


@pytest.mark.slow
@pytest.mark.parametrize("stopped", [0, 1])
def test_hung_rank_ends_the_group(model_dir, tmp_path, stopped):
    """A stopped rank keeps its sockets open, so only the watchdog can notice: the other rank
    exits 1 within about GRAPHC_DIST_TIMEOUT seconds, naming what did not finish."""
    procs, _ = _serve_ranks(tmp_path, str(model_dir("llama")), env={"GRAPHC_DIST_TIMEOUT": "4"})
    other = procs[1 - stopped]
    try:
        procs[stopped].send_signal(signal.SIGSTOP)
        code, err = _wait_exit(other, 40)
        assert code == 1 and "did not finish in 4 s" in err, err[-3000:]
    finally:
        procs[stopped].send_signal(signal.SIGCONT)
        _end(procs)


# -- in-process: the plan format and what is refused ----------------------------------------------
def test_plan_round_trip():
    from graphc.runtime.distributed.plan import STEP, Plan, decode_params, encode_params
    from graphc.runtime.grammar import Grammar

    p = SamplingParams(max_tokens=5, temperature=0.7, seed=9, logit_bias={3: -1.5}, stop=("x",),
                       banned_token_ids=(4,), grammar=Grammar.regex("[ab]+"))
    plan = Plan(STEP, 7, 123, [["add", "req-1", [1, 2, 3], encode_params(p)], ["abort", "req-0"]])
    body = plan.body()
    back = Plan.parse(plan.header(len(body)), body)
    assert (back.kind, back.seq, back.last_digest) == (STEP, 7, 123)
    assert decode_params(back.events[0][3]) == p
    assert back.events[1] == ["abort", "req-0"]
    with pytest.raises(ValueError, match="out of step"):
        Plan.parse([0] * 8, b"")


def test_logits_processors_are_refused():
    from graphc.runtime.distributed.plan import encode_params

    with pytest.raises(ValueError, match="logits_processors"):
        encode_params(SamplingParams(logits_processors=[lambda ids, x: x]))


def test_unshardable_model_is_refused(model_dir):
    import mlx_lm

    from graphc.runtime.distributed import check_shardable

    path = model_dir("gemma3_text")  # mlx-lm 0.32 has no shard() for gemma3
    model, _ = mlx_lm.load(str(path), lazy=True)
    cfg = json.loads((path / "config.json").read_text())
    with pytest.raises(ValueError, match="no tensor-parallel shard"):
        check_shardable(model, cfg, 2)
    llama, _ = mlx_lm.load(str(model_dir("llama")), lazy=True)
    with pytest.raises(ValueError, match="num_key_value_heads = 2 does not divide over 4 ranks"):
        check_shardable(llama, {"num_attention_heads": 4, "num_key_value_heads": 2}, 4)


def test_world_of_one_loads_a_plain_engine(model_dir, caplog):
    e = Engine.load(model_dir("llama"), distributed=True)
    assert type(e) is Engine
    [r] = e.generate([[5, 6, 7]], SamplingParams(max_tokens=3))
    assert len(r.token_ids) == 3


@pytest.mark.slow
def test_a_rank_that_cannot_load_ends_the_launch(model_dir, tmp_path):
    """Rank 1 lacks the model folder: both ranks exit with the reason instead of rank 0 waiting."""
    folders = [str(model_dir("llama")), str(tmp_path / "missing")]
    procs = _spawn_ranks(tmp_path, lambda r: [GRAPHC, "generate", "hi", "--model", folders[r], "--max-tokens", "2"])
    try:
        code0, err0 = _wait_exit(procs[0], 120)
        code1, err1 = _wait_exit(procs[1], 30)
        assert code1 == 2 and "no model folder" in err1 and "on rank 1" in err1, err1[-2000:]
        assert code0 == 1 and "rank(s) [1] could not load the model" in err0, err0[-2000:]
    finally:
        _end(procs)


def test_follower_replays_plans_and_stops_on_divergence(model_dir, monkeypatch):
    """The follower loop fed scripted plans (no processes): it applies rank 0's requests, runs the
    same steps, ends with 0 on SHUTDOWN, and refuses to go on when rank 0's digest differs."""
    from graphc.runtime.distributed import follower
    from graphc.runtime.distributed.plan import IDLE, SHUTDOWN, STEP, Plan, encode_params, step_digest

    class World:
        def rank(self):
            return 1

        def size(self):
            return 2

    ref = Engine.load(model_dir("llama"))
    rid = ref.add_request([5, 6, 7], SamplingParams(max_tokens=3))
    digests = []
    while ref.has_unfinished():
        digests.append(step_digest(ref.step()))

    def run(plans) -> int:
        wire = []
        for p in plans:
            body = p.body()
            wire += [("ints", p.header(len(body)))] + ([("bytes", body)] if body else [])
        feed = iter(wire)
        monkeypatch.setattr(follower, "broadcast_ints", lambda g, v, n: next(feed)[1])
        monkeypatch.setattr(follower, "broadcast_bytes", lambda g, d, n: next(feed)[1])
        from graphc.runtime.distributed.watchdog import Watchdog

        return follower.follow(Engine.load(model_dir("llama")), World(), Watchdog(1), timeout=60)

    add = ["add", rid, [5, 6, 7], encode_params(SamplingParams(max_tokens=3))]
    steps = [Plan(STEP, 0, 0, [add])] + [Plan(STEP, i + 1, digests[i]) for i in range(len(digests) - 1)]
    n = len(steps)
    assert run(steps + [Plan(IDLE, n, digests[-1]), Plan(SHUTDOWN, n + 1, digests[-1])]) == 0
    assert run(steps[:2] + [Plan(STEP, 2, 12345)]) == 1  # rank 0 saw other tokens at step 1


def test_leader_grammar_compiler_keeps_the_spec(model_dir):
    """The server compiles grammars before they reach the engine; the leader's compiler keeps
    each grammar's spec on its state so the followers can compile the same one."""
    from graphc.runtime.distributed.leader import _SpecKeepingCompiler
    from graphc.runtime.distributed.plan import decode_params, encode_params
    from graphc.runtime.grammar import Grammar, GrammarCompiler

    e = Engine.load(model_dir("llama"))
    comp = _SpecKeepingCompiler(GrammarCompiler(e.tokenizer, e.vocab_size, e.eos_token_ids))
    state = comp.compile({"type": "regex", "pattern": "[ab]+"})
    sent = decode_params(encode_params(SamplingParams(grammar=state)))
    assert sent.grammar == Grammar.regex("[ab]+")
    with pytest.raises(ValueError, match="cannot be sent"):
        encode_params(SamplingParams(grammar=e.grammar_compiler.compile(Grammar.regex("a"))))


def test_bench_runs_on_one_process(tmp_path):
    from graphc.benchmarks.tp import main

    out = tmp_path / "tp1.json"
    assert main(["--shape", "tiny", "--dtype", "float32", "--batches", "1,2", "--warm", "1", "--steps", "2",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"1", "2"} and all(r["graphc"] > 0 and r["mlx_lm"] > 0 for r in rows.values())


@pytest.mark.slow
def test_bench_runs_on_two_ranks(tmp_path):
    out = tmp_path / "tp2.json"
    run = _launch("--", sys.executable, "-m", "graphc.benchmarks.tp", "--shape", "tiny",
                  "--dtype", "float32", "--batches", "2", "--warm", "1", "--steps", "2", "--json", str(out))
    assert out.exists(), run.stderr[-3000:]
    assert json.loads(out.read_text())["tp"] == 2


def test_probe_runs_on_one_process(tmp_path):
    """The TP probe's rows on a world of one: collectives are the identity, so with and without
    them the chain computes the same thing and each collective adds ~nothing; the model rows time
    mlx-lm's own loop in every variant."""
    from graphc.benchmarks.tp_probe import main as probe

    out = tmp_path / "p.jsonl"
    assert probe(["--sizes", "1024", "--rows", "1", "--hidden", "64", "--inner", "128", "--layers", "2",
                  "--reps", "2", "--warm", "1", "--model", "tiny", "--json", str(out), "--label", "t"]) == 0
    r = json.loads(out.read_text())
    assert r["world"] == 1 and r["label"] == "t" and set(r["alone_us"]) == {"1024"}
    assert r["in_step"][0]["collectives"] == 4 and r["in_step"][0]["with_collectives_ms"] > 0
    assert [m["variant"] for m in r["model"]] == ["as-is", "no-collectives", "plain-linear"]
    assert all(m["ms_per_step"] >= m["encode_ms_per_step"] > 0 for m in r["model"])
