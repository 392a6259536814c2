"""Speculative decoding through the server: the request field, the server default, /metrics."""

from __future__ import annotations

import httpx
import pytest

from graphc.runtime import Engine
from server_harness import MODEL, live_server, wait_until

# A prompt that repeats itself: prompt lookup finds drafts in it even on a random-weight model.
PROMPT = "the cat sat on the mat and the dog sat on the log " * 4


@pytest.fixture(scope="module")
def server(model_dir):
    """Speculation on by default: `graphc serve --speculative prompt_lookup --num-draft-tokens 3`."""
    import argparse

    from graphc.runtime.server.cli import add_parser, config_from_args
    from graphc.runtime.server.state import load_engine

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--model", str(model_dir("llama")), "--speculative", "prompt_lookup",
                              "--num-draft-tokens", "3"])
    config = config_from_args(args)
    assert config.speculative == "prompt_lookup" and config.num_draft_tokens == 3
    with live_server(engine=load_engine(config)) as s:
        yield s


def _post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=60)


def test_server_default_speculates_and_metrics_count_it(server):
    assert server.state.engine.speculator.default is not None  # the flag reached the engine
    before = server.metric("graphc_spec_draft_tokens_total")
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                                          "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert wait_until(lambda: server.metric("graphc_spec_draft_tokens_total") > before)
    assert server.metric("graphc_spec_verify_steps_total") > 0
    assert 0 <= server.metric("graphc_spec_acceptance_rate") <= 1
    # Same text with speculation off for this request: greedy output does not change.
    off = _post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                                            "ignore_eos": True, "speculative": "off"})
    assert off.json()["choices"][0]["text"] == r.json()["choices"][0]["text"]


def test_chat_accepts_a_speculative_object(server):
    r = _post(server, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0,
        "speculative": {"method": "prompt_lookup", "num_draft_tokens": 2}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("value, param", [("medusa", "speculative"), ({"method": "prompt_lookup", "k": 2}, "speculative"),
                                          ({"num_draft_tokens": 0}, "speculative"), (7, "speculative")])
def test_bad_speculative_values_are_400(server, value, param):
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2, "speculative": value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err


def test_serve_draft_model_flag_reaches_the_engine(model_dir):
    import argparse

    from graphc.runtime.server.cli import add_parser, config_from_args
    from graphc.runtime.server.state import load_engine

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    path = str(model_dir("llama"))
    config = config_from_args(parser.parse_args(["serve", "--model", path, "--draft-model", path]))
    eng = load_engine(config)
    assert eng.speculator.draft_model is not None and eng.speculator.default.method == "draft_model"


def test_a_model_that_cannot_roll_back_refuses_it_with_the_reason(model_dir):
    with live_server(engine=Engine.load(model_dir("gemma3_text"), prefill_chunk=16)) as s:
        r = _post(s, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                         "speculative": "prompt_lookup"})
        assert r.status_code == 400, r.text
        assert "speculative decoding is off for this model" in r.json()["error"]["message"]
        ok = _post(s, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200
