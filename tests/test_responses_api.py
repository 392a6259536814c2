"""/v1/responses driven by the official `openai` client's `responses` methods against a live server.

The model is the tiny random-weight llama with a tools chat template: its text is noise, so
what is checked is the protocol — the client parses every object and event, the event
order is the documented one, token counts add up, forced tool calls are valid against
their schema, structured output parses and validates, follow-ups through
previous_response_id see the earlier conversation (longer prompt, prefix-cache hits).
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from graphc.runtime.server.responses_store import ResponseStore
from server_harness import MODEL, live_server

CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}}, "required": ["city"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": CITY}]


@pytest.fixture(scope="module")
def server(model_dir):
    with live_server(model_dir("llama", chat_template="tools")) as s:
        yield s


def test_create_with_text_input_and_instructions(client):
    r = client.responses.create(model=MODEL, input="Hello", instructions="Be brief.", max_output_tokens=6,
                                temperature=0.7, top_p=0.9, extra_body={"seed": 1})
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert r.output_text == item.content[0].text
    u = r.usage
    assert u.output_tokens == 6 and u.total_tokens == u.input_tokens + 6
    assert 0 <= u.input_tokens_details.cached_tokens <= u.input_tokens
    assert r.instructions == "Be brief." and r.temperature == 0.7 and r.max_output_tokens == 6


def test_message_list_input_counts_more_prompt_tokens(client):
    short = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    long = client.responses.create(model=MODEL, max_output_tokens=2, input=[
        {"role": "developer", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "And again"}]}])
    assert long.usage.input_tokens > short.usage.input_tokens


def test_stream_event_sequence(client):
    # Cut short by max_output_tokens, the stream ends with response.incomplete (the API's terminal
    # event for that status); the client's `responses.stream` helper only finalizes on
    # response.completed, so the raw event stream is read here.
    # Greedy: a sampled token could be EOS within the 5 (the tiny model's EOS has some probability),
    # which ends the response as completed.
    events = list(client.responses.create(model=MODEL, input="Hello", max_output_tokens=5, stream=True,
                                          temperature=0.0))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and final.usage.output_tokens == 5
    assert events[-1].response.status == "incomplete"


def test_stream_completed_when_the_model_stops(client):
    # A JSON schema with one short enum value: the grammar ends the reply well before the budget.
    fmt = {"format": {"type": "json_schema", "name": "y", "schema": {"enum": ["yes", "no"]}}}
    with client.responses.stream(model=MODEL, input="x", max_output_tokens=40, text=fmt) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert kinds[-1] == "response.completed" and final.status == "completed"
    assert json.loads(final.output_text) in ("yes", "no")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_tool_call_is_valid(client, choice):
    r = client.responses.create(model=MODEL, input="Weather in Paris?", tools=TOOLS, tool_choice=choice,
                                max_output_tokens=120, temperature=1.0, extra_body={"seed": 3})
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and r.status == "completed"
    for c in calls:
        assert c.name == "get_weather" and c.call_id.startswith("call_") and c.status == "completed"
        jsonschema.validate(json.loads(c.arguments), CITY)


def test_streamed_tool_call_events(client):
    with client.responses.stream(model=MODEL, input="Weather?", tools=TOOLS, max_output_tokens=120,
                                 tool_choice={"type": "function", "name": "get_weather"}) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    jsonschema.validate(json.loads(done.arguments), CITY)
    (call,) = [o for o in final.output if o.type == "function_call"]
    assert call.arguments == done.arguments


def test_tool_round_trip_and_previous_response_id(client):
    first = client.responses.create(model=MODEL, input="Weather in Oslo?", tools=TOOLS, tool_choice="required",
                                    max_output_tokens=120, temperature=1.0, extra_body={"seed": 4})
    call = next(o for o in first.output if o.type == "function_call")
    follow = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=TOOLS, max_output_tokens=3,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert follow.previous_response_id == first.id
    # The follow-up's prompt holds the first one's prompt and reply, which the prefix cache still has.
    assert follow.usage.input_tokens > first.usage.input_tokens
    assert follow.usage.input_tokens_details.cached_tokens > 0
    assert client.responses.retrieve(follow.id).id == follow.id


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                             "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Answer in JSON", max_output_tokens=60, temperature=1.0,
                                text={"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                                 "strict": True}})
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), schema)


def test_tools_with_text_format_give_the_answer_or_calls(client):
    """tool_choice auto with a JSON format (an agent with an output type): every reply is either
    a schema-valid JSON answer or schema-valid calls, never free text."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    kinds = set()
    for seed in range(6):
        r = client.responses.create(model=MODEL, input="Weather?", tools=TOOLS, max_output_tokens=120,
                                    temperature=1.0, extra_body={"seed": seed},
                                    text={"format": {"type": "json_schema", "name": "a", "schema": schema}})
        assert r.status == "completed"
        for o in r.output:
            kinds.add(o.type)
            if o.type == "message":
                jsonschema.validate(json.loads(o.content[0].text), schema)
            else:
                jsonschema.validate(json.loads(o.arguments), CITY)
    assert kinds


def test_store_false_and_unknown_ids(client):
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(r.id)
    assert e.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, input="Hi", max_output_tokens=1, previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    kept = client.responses.create(model=MODEL, input="Hi", max_output_tokens=1)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


@pytest.mark.parametrize("body, param", [
    ({"input": 5}, "input"),
    ({}, "input"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input"),
    ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),  # 0 is prompt only (docs/quickstart.md)
    ({"input": "x", "max_output_tokens": 10 ** 7}, "max_output_tokens"),
    ({"input": "x", "temperature": -1}, "temperature"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}}, "text"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text"),
    ({"input": "x", "background": True}, "background"),  # refused, not ignored
    ({"input": "x", "conversation": "conv_123"}, "conversation"),
    ({"input": "x", "stream": "yes"}, "stream"),
    ({"input": "x", "tools": TOOLS, "text": {"format": {"type": "json_schema", "name": "a",
                                                 "schema": {"type": "nonsense"}}}}, "text"),
])
def test_bad_requests_name_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/responses", json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"] == "invalid_request_error"


def test_unknown_model_is_404(server):
    r = httpx.post(server.url + "/v1/responses", json={"model": "other", "input": "x"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_store_is_bounded_lru():
    s = ResponseStore(capacity=2)
    s.put("a", [], {"id": "a"})
    s.put("b", [], {"id": "b"})
    s.get("a")  # a is now the most recently used
    s.put("c", [], {"id": "c"})
    assert len(s) == 2 and s.get("a").response["id"] == "a" and s.get("c")
    with pytest.raises(Exception, match="no response with id 'b'"):
        s.get("b")
