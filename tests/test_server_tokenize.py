"""POST /tokenize and /detokenize (server/token_routes.py): the ids the generating routes
would run, without generating; vLLM's request and response shapes."""

from __future__ import annotations

import httpx
import pytest

from server_harness import MODEL, live_server

HI = [{"role": "user", "content": "Tell me a story about a dragon."}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]


@pytest.fixture(scope="module")
def server(model_dir):
    with live_server(model_dir("llama", chat_template="tools"), api_key="sk-test") as s:
        yield s


def _post(server, path, body, key="sk-test"):
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"})


def test_a_prompt_is_the_completion_route_s_ids(server):
    text = "Once upon a time, in a land far away"
    r = _post(server, "/tokenize", {"model": MODEL, "prompt": text}).json()
    tok = server.state.tokenizer
    assert r["tokens"] == list(tok.encode(text)) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == server.state.max_model_len and "token_strs" not in r
    # the same ids /v1/completions runs: its usage counts them
    usage = _post(server, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == r["count"]
    bare = _post(server, "/tokenize", {"prompt": text, "add_special_tokens": False,
                                       "return_token_strs": True}).json()
    assert bare["tokens"] == list(tok._tokenizer.encode(text, add_special_tokens=False))
    assert bare["token_strs"] == tok.convert_ids_to_tokens(bare["tokens"])


def test_messages_are_the_chat_route_s_prompt_tools_included(server):
    for extra in ({}, {"tools": TOOLS}, {"add_generation_prompt": False}):
        r = _post(server, "/tokenize", {"model": MODEL, "messages": HI, **extra}).json()
        usage = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 1,
                                                       **extra}).json()["usage"]
        assert r["count"] == usage["prompt_tokens"] == len(r["tokens"]), extra
    plain = _post(server, "/tokenize", {"messages": HI}).json()["count"]
    assert _post(server, "/tokenize", {"messages": HI, "tools": TOOLS}).json()["count"] > plain


def test_detokenize_is_the_inverse(server):
    ids = _post(server, "/tokenize", {"prompt": "a dragon slept", "add_special_tokens": False}).json()["tokens"]
    assert _post(server, "/detokenize", {"model": MODEL, "tokens": ids}).json() == {"prompt": "a dragon slept"}


def test_a_prompt_longer_than_the_server_runs_is_still_counted(model_dir):
    with live_server(model_dir("llama"), max_prompt_tokens=8) as s:
        r = httpx.post(s.url + "/tokenize", json={"prompt": "one two three four five six seven eight nine ten"})
        assert r.status_code == 200 and r.json()["count"] > 8
        gen = httpx.post(s.url + "/v1/completions", json={"prompt": "one two three four five six seven eight nine ten"})
        assert gen.status_code == 400 and gen.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("path, body, status, needle", [
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "tool", "content": "3", "tool_call_id": "c"}]}, 400, "tool message"),
    ("/tokenize", {"prompt": "x", "model": "nope"}, 404, "nope"),
    ("/detokenize", {"tokens": [1, -1]}, 400, "out of range"),
    ("/detokenize", {"tokens": [10 ** 9]}, 400, "out of range"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
])
def test_bad_requests_are_openai_shaped_400s(server, path, body, status, needle):
    r = _post(server, path, body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def test_the_api_key_guards_them(server):
    assert _post(server, "/tokenize", {"prompt": "x"}, key="wrong").status_code == 401
    assert _post(server, "/detokenize", {"tokens": [1]}, key="wrong").status_code == 401
