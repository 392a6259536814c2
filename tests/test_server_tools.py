"""Tool calling through the server: OpenAI's wire format, and calls that always parse and validate.

The model is a tiny random-weight llama whose chat template knows tools (`make-model
--chat-template tools`). Random weights make the text meaningless, which is the point for
the guarantee: whatever the model prefers, a returned call's arguments are valid JSON that
validates against the function's schema, because the grammar allowed nothing else.
"""

from __future__ import annotations

import json
import random

import httpx
import jsonschema
import pytest

from graphc.runtime.server.tool_output import ToolStream, split_calls
from graphc.runtime.server.tools import HERMES

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(model_dir):
    from server_harness import live_server

    with live_server(model_dir("llama", chat_template="tools")) as s:
        yield s


def _check_calls(calls, schemas=SCHEMAS):
    assert calls, "no tool call"
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, {**schemas[c.function.name], "additionalProperties": False})


def test_required_returns_valid_calls(client):
    r = client.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, tool_choice="required",
                                       max_tokens=120, temperature=1.0, seed=3)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    _check_calls(ch.message.tool_calls)
    assert ch.message.content is None


def test_named_function_and_no_parallel(client):
    choice = {"type": "function", "function": {"name": "add"}}
    for seed in range(3):
        r = client.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, tool_choice=choice,
                                           max_tokens=120, temperature=1.0, seed=seed)
        calls = r.choices[0].message.tool_calls
        assert len(calls) == 1 and calls[0].function.name == "add"
        _check_calls(calls)
    r = client.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=160, temperature=1.0, seed=5)
    assert len(r.choices[0].message.tool_calls) == 1


def test_none_gives_text_and_auto_is_text_or_valid_calls(client):
    r = client.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, tool_choice="none",
                                       max_tokens=12, temperature=0.0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"
    for seed in range(4):
        r = client.chat.completions.create(model="tiny", messages=MSGS, tools=TOOLS, max_tokens=60,
                                           temperature=1.0, seed=seed)
        m = r.choices[0].message
        if m.tool_calls:
            _check_calls(m.tool_calls)
            assert r.choices[0].finish_reason == "tool_calls"
        else:
            assert "<tool_call>" not in (m.content or "") or r.choices[0].finish_reason == "length"


def test_streamed_deltas_reassemble_to_the_same_calls(client):
    kw = dict(model="tiny", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=160,
              temperature=1.0, seed=11)
    whole = client.chat.completions.create(**kw).choices[0]
    calls, finish, first_heads = {}, None, []
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        assert not d.content, "call markup leaked into content"
        for tc in d.tool_calls or []:
            if tc.id:
                first_heads.append(tc)
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert all(h.type == "function" and h.function.arguments == "" for h in first_heads)
    got = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]
    want = [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    assert got == want


def test_tool_results_in_the_conversation(client, server):
    history = MSGS + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    r = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, tool_choice="none",
                                       max_tokens=4, temperature=0.0)
    assert r.choices[0].message.content is not None
    # the template saw both the call and the result
    from graphc.runtime.server.tool_prompt import render_messages

    tok = server.state.tokenizer
    msgs, tools = render_messages(history, None, tok.chat_template, HERMES)
    prompt = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert '"city": "Paris"' in prompt and "<tool_response>" in prompt and '"temperature": 21' in prompt


@pytest.mark.parametrize("body, param, text", [
    ({"tools": [{"type": "retrieval"}]}, "tools", "only tools of type 'function'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "'nope', which is not in tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "appears twice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format", "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}],
      "tool_choice": "required"}, "tools", "schema of function 'f' is not usable: Invalid type: strin"),
])
def test_bad_tool_requests_are_400s(server, body, param, text):
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": "tiny", "messages": MSGS, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and text in err["message"]
    assert err["code"] == "invalid_value"


@pytest.mark.parametrize("calls, text", [
    ("x", "must be a list of tool calls, got str"),
    (["x"], "tool_calls[0] must be"),
    ({"a": 1}, "must be a list of tool calls, got dict"),
    ([{"function": "x"}], "tool_calls[0] must be"),
    ([{"function": {"arguments": "{}"}}], "tool_calls[0] must be"),
    ([{"function": {"name": "add", "arguments": 5}}], "arguments must be a JSON string or an object"),
])
@pytest.mark.parametrize("with_tools", [False, True])
def test_malformed_past_tool_calls_are_400s_not_500s(server, calls, text, with_tools):
    """An assistant message's `tool_calls` is read by the template and the call markup: a shape
    other than OpenAI's is the client's error, named, and the server goes on serving."""
    history = MSGS + [{"role": "assistant", "content": None, "tool_calls": calls}]
    body = {"model": "tiny", "messages": history, "max_tokens": 2, **({"tools": TOOLS} if with_tools else {})}
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "messages[1].tool_calls" in err["message"] and text in err["message"]
    ok = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": MSGS, "max_tokens": 2})
    assert ok.status_code == 200


@pytest.mark.parametrize("messages,text", [
    ([{"role": "user", "content": None}], "messages[0].content is required for a user message"),
    ([{"role": "system"}, {"role": "user", "content": "hi"}], "messages[0].content is required for a system"),
    ([{"role": "tool", "tool_call_id": "c1", "content": "3"}], "messages[0]: a tool message must answer"),
    ([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c1", "content": "3"}],
     "messages[1]: a tool message must answer"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
      {"role": "tool", "tool_call_id": "c1", "content": "3"}], "messages[2]: a tool message must answer"),
    ([{"role": "user", "content": "hi"},
      {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "add", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1"}], "messages[2].content is required for a tool message"),
])
def test_conversations_openai_refuses_are_400s(server, messages, text):
    """A null user/system/tool content or a tool result that answers no call is refused, as
    OpenAI refuses it, instead of a template rendering a conversation the client did not send."""
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and text in err["message"], err


def test_tool_results_after_their_calls_are_served(server):
    """The shape the check allows: an assistant turn's calls, then one tool message per call."""
    calls = [{"id": f"c{k}", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
             for k in range(2)]
    history = MSGS + [{"role": "assistant", "content": None, "tool_calls": calls},
                      {"role": "tool", "tool_call_id": "c0", "content": "3"},
                      {"role": "tool", "tool_call_id": "c1", "content": "3"}]
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": history, "max_tokens": 2,
                                                              "tools": TOOLS})
    assert r.status_code == 200, r.text


def test_legacy_functions_and_function_call(server):
    """The pre-tools spelling: `functions` are the tools, `function_call` the tool_choice."""
    fns = [t["function"] for t in TOOLS]
    url = server.url + "/v1/chat/completions"
    for seed in range(2):
        r = httpx.post(url, json={"model": "tiny", "messages": MSGS, "functions": fns, "max_tokens": 120,
                                  "function_call": {"name": "add"}, "temperature": 1.0, "seed": seed}).json()
        calls = r["choices"][0]["message"]["tool_calls"]
        assert r["choices"][0]["finish_reason"] == "tool_calls" and [c["function"]["name"] for c in calls] == ["add"]
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), SCHEMAS["add"])
    r = httpx.post(url, json={"model": "tiny", "messages": MSGS, "functions": fns, "function_call": "none",
                              "max_tokens": 8, "temperature": 0.0}).json()
    assert r["choices"][0]["message"].get("tool_calls") is None and r["choices"][0]["finish_reason"] == "length"
    r = httpx.post(url, json={"model": "tiny", "messages": MSGS, "functions": fns, "function_call": {"name": "nope"},
                              "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text


def test_split_and_stream_parsers_agree_at_any_chunking():
    text = ('Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "<Oslo>", "unit": "celsius"}}\n</tool_call>')
    content, calls = split_calls(text, HERMES)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["add", "get_weather"]
    rng = random.Random(0)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), 8))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        ts, got_content, got_calls = ToolStream(HERMES), "", []
        for p in pieces:
            for kind, v in ts.feed(p):
                if kind == "content":
                    got_content += v
                else:
                    got_calls.append(v)
        assert ts.flush() == ""
        assert got_content.strip() == content
        assert [json.loads(c["function"]["arguments"]) for c in got_calls] == \
            [json.loads(c["function"]["arguments"]) for c in calls]
    # cut short by max_tokens: not a call, and nothing generated is lost
    content, calls = split_calls('<tool_call>\n{"name": "add", "argu', HERMES)
    assert calls == [] and content.startswith("<tool_call>")


def _seeded_requests(client, n, seed0):
    rng = random.Random(seed0)
    for k in range(n):
        tools = rng.sample(TOOLS, rng.choice([1, 2]))
        choice = rng.choice(["required", {"type": "function", "function": {"name": tools[0]["function"]["name"]}}])
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"request {k}: {rng.random()}"}], tools=tools,
            tool_choice=choice, parallel_tool_calls=rng.random() < 0.5, max_tokens=200,
            temperature=rng.choice([0.7, 1.0, 1.5]), top_p=rng.choice([1.0, 0.9]), seed=rng.randrange(10**6))
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", (k, ch)
        _check_calls(ch.message.tool_calls)


def test_seeded_calls_always_validate_short(client):
    _seeded_requests(client, 12, seed0=1)


@pytest.mark.slow
def test_seeded_calls_always_validate_200(client):
    _seeded_requests(client, 200, seed0=2)
