"""Fuzzed bodies against /v1/responses, /v1/messages and /v1/messages/count_tokens: never a 5xx,
every error in the protocol's own shape, nothing left running (the same contract as the
chat/completions fuzz in test_server_errors.py)."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from server_harness import MODEL, live_server, wait_until

VALUES = [None, True, False, -1, 0, 1, 3, 2 ** 70, -(2 ** 70), 1e308, -1e308, 0.5, "", "x", "tiny", "\u00e9",
          [], [1], [[1]], [None], ["a", 1], {}, {"a": 1}, {"type": "x"}, {"format": 5}, {"type": "function"},
          {"type": "tool"}, {"type": "any"}, {"type": "tool", "name": "f"}, {"format": {"type": "json_schema"}},
          {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
          {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}},
          [{"type": "function", "name": "f"}], [{"type": "function", "name": "f", "parameters": 5}],
          [{"name": "f", "input_schema": {"type": "object"}}], [{"name": "bad name!", "input_schema": {}}],
          [{"type": "web_search"}], "resp_nope", "auto", "required", "none"]
RESPONSES_VALUES = VALUES + [
    [{"role": "user", "content": [{"type": "input_text"}]}], [{"type": "function_call"}],
    [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}],
    [{"type": "function_call_output", "call_id": 1}], [{"type": "function_call_output", "call_id": "c",
                                                        "output": [{"type": "input_text", "text": "r"}]}],
    [{"type": "reasoning"}], [{"role": "bogus", "content": "x"}], [{"role": "user", "content": None}]]
MESSAGES_VALUES = VALUES + [
    [{"role": "user", "content": [{"type": "tool_result"}]}],
    [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}]}],
    [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": 5}]}],
    [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]},
     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "ok"}]}],
    [{"role": "user", "content": [{"type": "thinking"}]}], [{"role": "user"}], [{"role": "system", "content": "x"}],
    [{"type": "text", "text": 5}], [{"type": "text", "text": "sys"}]]
RESPONSES_FIELDS = ["model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_k", "seed",
                    "tools", "tool_choice", "parallel_tool_calls", "text", "previous_response_id", "store", "stream",
                    "metadata", "user"]
MESSAGES_FIELDS = ["model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k",
                   "tools", "tool_choice", "stream", "metadata", "output_config"]


@pytest.fixture(scope="module")
def small(model_dir):
    """Tight limits: context 64, prompts <= 40 tokens, 2 KB bodies, one row and no queue."""
    with live_server(model_dir("llama", chat_template="tools"), max_model_len=64, max_prompt_tokens=40,
                     max_body_bytes=2048, max_batch=1, max_queued=0) as s:
        yield s


def _openai_error(r) -> None:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], r.text


def _anthropic_error(r) -> None:
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["message"], r.text


def _raw(rng: random.Random, body: dict) -> bytes:
    raw = json.dumps(body).encode()
    r = rng.random()
    if r < 0.05:
        return raw[: rng.randrange(max(1, len(raw)))]  # truncated
    if r < 0.08:
        return rng.choice([b"[]", b"null", b'"x"', b"{}", b'{"max_tokens": NaN}', b"\xff\xfe"])
    return raw


def test_fuzzed_bodies_never_5xx_and_leave_nothing_behind(small):
    rng = random.Random(38)
    seen: dict[str, set] = {}
    with httpx.Client(timeout=60) as c:
        for _ in range(300):
            path = rng.choice(["/v1/responses", "/v1/messages", "/v1/messages/count_tokens"])
            if path == "/v1/responses":
                body = {"model": MODEL, "input": "Hi", "max_output_tokens": 2}
                fields, values = RESPONSES_FIELDS, RESPONSES_VALUES
            else:
                body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
                fields, values = MESSAGES_FIELDS, MESSAGES_VALUES
            for field in rng.sample(fields, rng.randint(0, 3)):  # 0: the valid body, so 200s are seen too
                body[field] = rng.choice(values)
            raw = _raw(rng, body)
            r = c.post(small.url + path, content=raw, headers={"content-type": "application/json"})
            seen.setdefault(path, set()).add(r.status_code)
            assert r.status_code in (200, 400, 404, 413), (path, raw[:300], r.status_code, r.text[:300])
            if r.status_code != 200:
                (_openai_error if path == "/v1/responses" else _anthropic_error)(r)
    for path, statuses in seen.items():
        assert 200 in statuses and 400 in statuses, (path, statuses)
    assert wait_until(lambda: small.state.aengine.num_inflight == 0)
    assert httpx.get(small.url + "/health").status_code == 200
