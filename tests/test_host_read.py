"""How the host reads decode tokens (runtime/host_read.py): the 8-byte pieces give the same tokens,
through the runner's chain, and the option reaches the runner and the plan."""

import mlx.core as mx
import pytest

from graphc.compiler import decode_options
from graphc.runtime import host_read
from graphc.runtime.engine import Engine
from graphc.runtime.params import SamplingParams
from graphc.runtime.runner import ModelRunner


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_the_pieces_hold_the_tokens_in_order_and_each_fits_the_scalar_pool(n):
    toks = mx.array([(i * 7919 + 3) % 128256 for i in range(n)], dtype=mx.int32)
    pieces = host_read.for_host(toks, "pieces")
    assert len(pieces) == (n + 1) // 2
    assert all(p.nbytes <= 8 for p in pieces)  # MLX serves <= 8 bytes from its scalar pool
    mx.eval(pieces)
    assert host_read.read(pieces) == toks.tolist()
    assert host_read.read(host_read.for_host(toks, "tokens")) == toks.tolist()


def _outputs(eng, prompts, params):
    return [r.token_ids for r in eng.generate(prompts, params)]


@pytest.mark.parametrize("sampled", [False, True])
def test_the_chained_decode_gives_the_same_tokens_with_either_read(model_dir, sampled):
    d = model_dir("llama")
    prompts = [[5, 9, 13, 2], [7, 7, 1], [3, 4, 5, 6, 8, 9], [11], [2, 3]]  # odd batch: a 4-byte piece
    params = (SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=20, seed=7) if sampled
              else SamplingParams(max_tokens=12))
    ref = Engine.load(d, seed=1)
    assert ref.runner.host_read == "tokens"  # off CUDA: nothing migrates
    pieces = Engine.load(d, seed=1)
    pieces.runner.host_read = "pieces"
    assert _outputs(pieces, prompts, params) == _outputs(ref, prompts, params)
    assert pieces.runner.steps > 3  # chained decode steps ran


def test_the_option_reaches_the_runner_and_the_plan(model_dir, monkeypatch):
    d = model_dir("llama")
    assert "host read" not in dict(Engine.load(d).compiled.plan("decode").passes)  # off CUDA: no line
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    off = Engine.load(d)  # the default: the tokens themselves (pieces did not pay through the API)
    assert off.runner.host_read == "tokens"
    assert "the step's tokens themselves" in dict(off.compiled.plan("decode").passes)["host read"]
    on = Engine.load(d, decode_options={"host_read_pieces": True})
    assert on.runner.host_read == "pieces"
    assert "8-byte copies of each step's tokens" in dict(on.compiled.plan("decode").passes)["host read"]


def test_a_bad_strategy_or_option_is_refused():
    with pytest.raises(ValueError, match="host_read must be one of"):
        ModelRunner.__init__(object.__new__(ModelRunner), None, host_read="numpy")
    assert decode_options.problems({"host_read_pieces": "yes"}) == [
        "decode option 'host_read_pieces' must be true or false, got 'yes'"]
