"""graphs/embed.yaml through Engine.embed and /v1/embeddings, against a numpy reference of the
model's own final hidden states (mlx-lm's `model.model(tokens)`, one input at a time, no padding)."""

from __future__ import annotations

import base64

import mlx.core as mx
import mlx_lm
import numpy as np
import openai
import pytest

from graphc.runtime import Engine
from helpers import random_prompts

INPUTS_LENGTHS = [7, 1, 19, 4]


def reference(model, ids: list[int], method: str = "mean", dims: int | None = None) -> np.ndarray:
    h = np.array(model.model(mx.array([ids])).astype(mx.float32))[0]  # [L, D], after the final norm
    v = {"mean": h.mean(axis=0), "last": h[-1], "cls": h[0]}[method]
    v = v[:dims] if dims else v
    return v / np.linalg.norm(v)


def pool_graph(tmp_path, method: str) -> str:
    text = (_graphs() / "embed.yaml").read_text().replace(
        "params: {method: mean}", f"params: {{method: {method}}}")
    p = tmp_path / f"embed_{method}.yaml"
    p.write_text(text)
    return str(p)


def _graphs():
    from graphc.compiler.parse import GRAPHS_DIR

    return GRAPHS_DIR


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine.load(model_dir("llama"))


@pytest.mark.parametrize("method", ["mean", "last", "cls"])
def test_engine_embed_matches_numpy_reference(engine, tmp_path, method):
    prompts = random_prompts(len(INPUTS_LENGTHS), engine.vocab_size, INPUTS_LENGTHS, seed=3)
    graph = "embed" if method == "mean" else pool_graph(tmp_path, method)
    res = engine.embed(prompts, graph=graph)  # one left-padded batch of four lengths
    assert res.prompt_tokens == sum(INPUTS_LENGTHS)
    for ids, got in zip(prompts, res.embeddings):
        np.testing.assert_allclose(np.array(got), reference(engine.model, ids, method), atol=2e-5, rtol=0)
    # The pooling method changes the vector (the param is honoured), for inputs longer than one token.
    if method != "mean":
        mean = engine.embed(prompts[0]).embeddings[0]
        assert np.abs(np.array(mean) - np.array(res.embeddings[0])).max() > 1e-3


def test_dimensions_truncate_then_normalize(engine):
    ids = random_prompts(1, engine.vocab_size, [9], seed=5)[0]
    [v] = engine.embed(ids, dimensions=16).embeddings
    assert len(v) == 16 and abs(np.linalg.norm(v) - 1) < 1e-5
    np.testing.assert_allclose(v, reference(engine.model, ids, dims=16), atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="dimensions must be an integer"):
        engine.embed(ids, dimensions=10**6)


def test_strings_and_token_lists_agree(engine):
    text = "Once upon a time"
    ids = engine.tokenizer.encode(text)
    a, b = engine.embed([text, ids]).embeddings
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_generic_lowering_embeds_the_same(model_dir):
    """On the generic lowering (the model's own forward) the attention node runs the inner model to
    its final hidden states, since no logits node reads it."""
    eng = Engine.load(model_dir("llama"), lowering="generic")
    assert eng.compiled.binding.lowering == "generic"
    prompts = random_prompts(len(INPUTS_LENGTHS), eng.vocab_size, INPUTS_LENGTHS, seed=3)
    for ids, got in zip(prompts, eng.embed(prompts).embeddings):
        np.testing.assert_allclose(np.array(got), reference(eng.model, ids), atol=2e-5, rtol=0)
    plan = eng.oneshot("embed", "embeddings").compiled.plan("prefill")
    assert "llama.model(tokens, cache=graphc caches) -> final hidden states" in plan.steps[1].detail


def test_generation_graph_is_refused_for_embeddings(engine):
    with pytest.raises(ValueError, match="has no 'embeddings' output"):
        engine.embed("hi", graph="dense")


def test_openai_client_embeddings(client, model_dir):
    ref_model, tok = mlx_lm.load(str(model_dir("llama")))
    texts = ["Once upon a time", "the king", "x"]
    # The official client asks for base64 by default and decodes it.
    r = client.embeddings.create(model="tiny", input=texts)
    assert [d.index for d in r.data] == [0, 1, 2]
    want_tokens = sum(len(tok.encode(t)) for t in texts)
    assert r.usage.prompt_tokens == want_tokens == r.usage.total_tokens
    for t, d in zip(texts, r.data):
        np.testing.assert_allclose(d.embedding, reference(ref_model, tok.encode(t)), atol=2e-5, rtol=0)
    # Token arrays, float encoding, dimensions.
    ids = [tok.encode(t) for t in texts[:2]]
    r = client.embeddings.create(model="tiny", input=ids, encoding_format="float", dimensions=8)
    for i, d in zip(ids, r.data):
        assert len(d.embedding) == 8
        np.testing.assert_allclose(d.embedding, reference(ref_model, i, dims=8), atol=2e-5, rtol=0)
    r = client.embeddings.create(model="tiny", input=ids[0])
    assert len(r.data) == 1


def test_embeddings_errors_are_openai_400s(client, server):
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="tiny", input="hi", dimensions=10**6)
    with pytest.raises(openai.BadRequestError, match="input must be"):
        client.embeddings.create(model="tiny", input=[{"a": 1}])
    with pytest.raises(openai.BadRequestError, match="out of range"):
        client.embeddings.create(model="tiny", input=[10**9])
    # A raw base64 body is little-endian float32.
    import httpx

    r = httpx.post(server.url + "/v1/embeddings", json={"input": "hi", "encoding_format": "base64"}, timeout=30)
    vec = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert abs(np.linalg.norm(vec) - 1) < 1e-5


def test_compile_and_inspect_an_embedding_graph(model_dir):
    """compile_graph on a graph without next_tokens self-checks the model's generation graph and
    reuses its lowering; inspect shows the pooling steps (and that nothing chains)."""
    import json

    from graphc.compiler.compile import compile_graph
    from graphc.compiler.inspect import inspect_plan

    d = model_dir("llama")
    model, _ = mlx_lm.load(str(d))
    c = compile_graph("embed", model, json.loads((d / "config.json").read_text()))
    assert c.binding.check is not None and c.binding.check.ok
    text = inspect_plan(c, "prefill")
    assert "pool       pool         final norm, then mean" in text and "outputs:         embeddings <- normalize" in text
    assert "no next_tokens output" in inspect_plan(c, "decode", trace=False)
