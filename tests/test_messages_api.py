"""/v1/messages and /v1/messages/count_tokens driven by the official `anthropic` client.

The model is the tiny random-weight llama with a tools chat template: its text is noise, so
what is checked is the protocol — the client parses every message and stream event, the
event order is Anthropic's, token counts agree with count_tokens, stop reasons follow the
budget / stop sequences / tool calls, forced tool_use inputs are valid against
input_schema, and every error is Anthropic-shaped.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from server_harness import MODEL, live_server

anthropic = pytest.importorskip("anthropic")

CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}}, "required": ["city"],
        "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": CITY}]
HI = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(model_dir):
    with live_server(model_dir("llama", chat_template="tools"), api_key="sk-test") as s:
        yield s


@pytest.fixture(scope="module")
def ac(server):
    return anthropic.Anthropic(base_url=server.url, api_key="sk-test", max_retries=0)


def test_create_multi_turn_with_system(ac):
    m = ac.messages.create(model=MODEL, max_tokens=6, system=[{"type": "text", "text": "Be brief."}],
                           extra_body={"temperature": 0.7, "top_p": 0.9, "top_k": 20}, messages=[
                               {"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "Hello!"},
                               {"role": "user", "content": [{"type": "text", "text": "Again"}]}])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == MODEL
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    (block,) = m.content
    assert block.type == "text" and isinstance(block.text, str)
    assert m.usage.output_tokens == 6
    n = ac.messages.count_tokens(model=MODEL, system="Be brief.", messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Again"}])
    # Anthropic's split: input_tokens are the uncached part, cache_read_input_tokens the rest.
    assert n.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_stop_sequences_report_the_one_that_matched(ac):
    stops = [" ", "e", "a", "o", "t"]  # a random model writes one of these within a few tokens
    m = ac.messages.create(model=MODEL, max_tokens=60, messages=HI, stop_sequences=stops,
                           extra_body={"temperature": 1.0, "seed": 0})  # seeded: the same text every run
    assert m.stop_reason == "stop_sequence" and m.stop_sequence in stops
    assert not any(s in m.content[0].text for s in stops)


def test_stream_events_and_final_message(ac):
    with ac.messages.stream(model=MODEL, max_tokens=5, messages=HI) as s:
        events = list(s)
        final = s.get_final_message()
    kinds = [e.type for e in events if e.type not in ("text",)]  # "text" is the helper's own event
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) <= {"content_block_delta"}
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    assert final.content[0].text == "".join(e.delta.text for e in events if e.type == "content_block_delta")


def test_raw_stream_has_a_ping_after_the_first_block(server):
    body = {"model": MODEL, "max_tokens": 3, "messages": HI, "stream": True}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, headers={"x-api-key": "sk-test"}) as r:
        kinds = [ln[len("event: "):] for ln in r.iter_lines() if ln.startswith("event: ")]
    assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    assert kinds[-1] == "message_stop" and kinds.count("ping") == 1


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_forced_tool_use_is_valid(ac, choice):
    m = ac.messages.create(model=MODEL, max_tokens=120, messages=[{"role": "user", "content": "Weather?"}],
                           tools=TOOLS, tool_choice=choice, extra_body={"temperature": 1.0})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses
    for u in uses:
        assert u.name == "get_weather" and u.id.startswith("toolu_")
        jsonschema.validate(u.input, CITY)


def test_streamed_tool_use_and_tool_result_round_trip(ac):
    with ac.messages.stream(model=MODEL, max_tokens=120, messages=[{"role": "user", "content": "Weather?"}],
                            tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}) as s:
        final = s.get_final_message()
    (use,) = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(use.input, CITY)
    assert final.stop_reason == "tool_use"
    turns = [{"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    m = ac.messages.create(model=MODEL, max_tokens=3, messages=turns, tools=TOOLS,
                           tool_choice={"type": "none"})
    assert [b.type for b in m.content] == ["text"] and m.stop_reason == "max_tokens"
    n = ac.messages.count_tokens(model=MODEL, messages=turns, tools=TOOLS)
    assert n.input_tokens > ac.messages.count_tokens(model=MODEL, messages=turns[:1], tools=TOOLS).input_tokens


def test_output_config_json_schema(ac):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    m = ac.messages.create(model=MODEL, max_tokens=40, messages=HI, extra_body={"temperature": 1.0},
                           output_config={"format": {"type": "json_schema", "schema": schema}})
    assert m.stop_reason == "end_turn"
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_count_tokens_includes_tools(ac):
    plain = ac.messages.count_tokens(model=MODEL, messages=HI).input_tokens
    assert ac.messages.count_tokens(model=MODEL, messages=HI, tools=TOOLS).input_tokens > plain > 0


def test_count_tokens_refuses_what_create_refuses(server):
    """A tool schema the tool grammar cannot compile, or a tool_result that answers no tool_use,
    is the same 400 on count_tokens as on create (an agent counts before it sends)."""
    bad_tool = [{"name": "x", "input_schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}]
    lone_result = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "3"}]}]
    for extra, needle in (({"tools": bad_tool}, "not usable"), ({"messages": lone_result}, "tool message must answer")):
        seen = []
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            r = httpx.post(server.url + path, json={"model": MODEL, "messages": HI, "max_tokens": 3, **extra},
                           headers={"x-api-key": "sk-test"})
            assert r.status_code == 400 and needle in r.json()["error"]["message"], (path, r.text)
            seen.append(r.json())
        assert seen[0] == seen[1]


@pytest.mark.parametrize("body, status, kind, needle", [
    ({"messages": HI}, 400, "invalid_request_error", "max_tokens"),
    ({"messages": [], "max_tokens": 3}, 400, "invalid_request_error", "messages"),
    ({"messages": HI, "max_tokens": 3, "temperature": 1.5}, 400, "invalid_request_error", "temperature"),
    ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 3}, 400, "invalid_request_error", "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}], "max_tokens": 3}, 400,
     "invalid_request_error", "image"),
    ({"messages": HI, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    ({"messages": HI, "max_tokens": "8"}, 400, "invalid_request_error", "max_tokens"),
    ({"messages": HI, "max_tokens": 3, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, 400,
     "invalid_request_error", "nope"),
    ({"messages": HI, "max_tokens": 3, "tools": [{"name": "x"}]}, 400, "invalid_request_error", "input_schema"),
    ({"messages": HI, "max_tokens": 3, "tools": [{"type": "bash_20250124", "name": "bash"}]}, 400,
     "invalid_request_error", "tools"),
    ({"model": "claude-nope", "messages": HI, "max_tokens": 3}, 404, "not_found_error", "claude-nope"),
])
def test_errors_are_anthropic_shaped(server, body, status, kind, needle):
    r = httpx.post(server.url + "/v1/messages", json={"model": MODEL, **body}, headers={"x-api-key": "sk-test"})
    assert r.status_code == status, r.text
    data = r.json()
    assert data["type"] == "error" and set(data["error"]) == {"type", "message"}
    assert data["error"]["type"] == kind and needle in data["error"]["message"]


def test_client_raises_typed_errors(ac, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        ac.messages.create(model=MODEL, max_tokens=-1, messages=HI)
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        ac.messages.count_tokens(model="claude-nope", messages=HI)
    bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=MODEL, max_tokens=1, messages=HI)
    assert e.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(server.url + "/v1/messages", content=b"{", headers={"x-api-key": "sk-test",
                                                                       "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_a_final_assistant_turn_is_continued(ac, server):
    """Anthropic's prefill: the prompt ends inside the assistant's text (no closed turn, no new
    header), the same prompt as chat's continue_final_message."""
    prefill = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "The answer is"}]
    n = ac.messages.count_tokens(model=MODEL, messages=prefill).input_tokens
    auth = {"Authorization": "Bearer sk-test"}
    chat = httpx.post(server.url + "/v1/chat/completions", headers=auth, json={
        "model": MODEL, "messages": prefill, "max_tokens": 1, "continue_final_message": True,
        "add_generation_prompt": False}).json()
    closed = httpx.post(server.url + "/v1/chat/completions", headers=auth, json={
        "model": MODEL, "messages": prefill, "max_tokens": 1}).json()
    assert n == chat["usage"]["prompt_tokens"] < closed["usage"]["prompt_tokens"]
    m = ac.messages.create(model=MODEL, max_tokens=3, messages=prefill)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == n and m.usage.output_tokens == 3
    # a turn that ends with tool_use is not a prefill: the model answers after the results
    calls = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]
    assert ac.messages.create(model=MODEL, max_tokens=2, tools=TOOLS, messages=calls).usage.output_tokens == 2


def test_max_tokens_past_the_context_is_cut_to_what_fits(model_dir):
    """Agents send one max_tokens (32,000) to every model: on a 64-token context the reply fills
    the context and ends with stop_reason max_tokens (chat's routes still answer 400)."""
    with live_server(model_dir("llama", chat_template="tools"), max_model_len=64) as small:
        eos = {str(t): -100 for t in small.state.engine.eos_token_ids}
        r = httpx.post(small.url + "/v1/messages", json={"model": MODEL, "max_tokens": 32000, "messages": HI,
                                                         "logit_bias": eos, "temperature": 0})
        assert r.status_code == 200, r.text
        m = r.json()
        u = m["usage"]
        assert m["stop_reason"] == "max_tokens" and u["input_tokens"] + u["cache_read_input_tokens"] + u[
            "output_tokens"] == 64
        r = httpx.post(small.url + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 32000, "messages": HI})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_a_wrong_method_on_messages_is_anthropic_shaped(server):
    r = httpx.get(server.url + "/v1/messages", headers={"x-api-key": "sk-test"})
    assert r.status_code == 405
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and "GET" in body["error"]["message"]
    r = httpx.get(server.url + "/v1/chat/completions", headers={"Authorization": "Bearer sk-test"})
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
