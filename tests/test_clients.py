"""Third-party clients against graphc serve: instructor and langchain-openai, tools and JSON modes.

These libraries are not graphc dependencies (each pulls a tree of packages); the tests run
where they are installed (`pip install instructor langchain-openai langchain`) and are
skipped otherwise. The model is the tiny random-weight llama with a tools chat template:
what is checked is that the clients' own parsing and validation succeed on what the server
returns, which the grammar guarantees whatever the weights. Schemas are bounded
(Literal / ranges / max_length) so a random model's reply ends well before max_tokens.
"""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

instructor = pytest.importorskip("instructor")
langchain_openai = pytest.importorskip("langchain_openai")


class Weather(BaseModel):
    """Weather report for a city."""

    city: str = Field(max_length=12)
    unit: Literal["celsius", "fahrenheit"]
    temperature: int = Field(ge=-50, le=50)


@pytest.fixture(scope="module")
def server(model_dir):
    from server_harness import live_server

    with live_server(model_dir("llama", chat_template="tools")) as s:
        yield s


def _messages():
    return [{"role": "user", "content": "What is the weather in Paris?"}]


# JSON and MD_JSON modes put the schema in the prompt only (response_format json_object / none):
# a random-weight model cannot follow it; they are run on the real model (test_real_smollm2.py).
@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_modes(client, mode):
    ic = instructor.from_openai(client, mode=getattr(instructor.Mode, mode))
    for seed in range(2):
        w = ic.chat.completions.create(model="tiny", response_model=Weather, messages=_messages(),
                                       max_tokens=120, temperature=1.0, seed=seed, max_retries=0)
        assert isinstance(w, Weather)


def _chat(server, **kw):
    return langchain_openai.ChatOpenAI(model="tiny", base_url=server.url + "/v1", api_key="unused",
                                       max_retries=0, max_tokens=120, **kw)


# json_mode sends response_format json_object with no schema: run on the real model only.
@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_with_structured_output(server, method):
    llm = _chat(server, temperature=1.0, seed=3)
    out = llm.with_structured_output(Weather, method=method).invoke("What is the weather in Paris?")
    assert isinstance(out, Weather)


def test_langchain_bind_tools_invoke_and_stream(server):
    from langchain_core.tools import tool

    class Args(BaseModel):
        city: str = Field(max_length=12)
        unit: Literal["celsius", "fahrenheit"]

    @tool(args_schema=Args)
    def get_weather(city: str, unit: str) -> str:
        """Current weather in a city."""
        return f"21 {unit} in {city}"

    llm = _chat(server, temperature=1.0, seed=5).bind_tools([get_weather], tool_choice="get_weather")
    msg = llm.invoke("Weather in Paris?")
    (call,) = msg.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}
    assert get_weather.invoke(call["args"])  # the args pass the tool's own validation
    chunks = None
    for c in llm.stream("Weather in Paris?"):
        chunks = c if chunks is None else chunks + c
    assert [tc["name"] for tc in chunks.tool_calls] == ["get_weather"]
    assert chunks.tool_calls[0]["args"] == call["args"]  # same seed, same call, streamed


def test_langchain_agent_runs_a_tool_and_answers(server):
    """An agent loop: the model must call the tool first (tool_choice by a middleware-free
    trick: the agent's model is bound to require the tool on the first turn only), the
    tool runs, its result goes back as a `tool` message, and the model then answers."""
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool

    calls = []

    class Args(BaseModel):
        city: Literal["Paris", "Oslo", "Lima"]

    @tool(args_schema=Args)
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return "sunny, 21 celsius"

    class FirstTurnRequired(type(_chat(server))):
        """ChatOpenAI that requires a tool call until a tool result is in the conversation."""

        def _get_request_payload(self, input_, *, stop=None, **kwargs):
            payload = super()._get_request_payload(input_, stop=stop, **kwargs)
            if payload.get("tools") and not any(m.get("role") == "tool" for m in payload["messages"]):
                payload["tool_choice"] = "required"
                payload["parallel_tool_calls"] = False
            return payload

    llm = FirstTurnRequired(model="tiny", base_url=server.url + "/v1", api_key="unused", max_retries=0,
                            max_tokens=100, temperature=1.0, seed=7)
    agent = create_agent(llm, tools=[get_weather])
    result = agent.invoke({"messages": [{"role": "user", "content": "Weather in Paris?"}]},
                          {"recursion_limit": 6})
    msgs = result["messages"]
    assert len(calls) == 1, [(type(m).__name__, m.content[:200], getattr(m, "response_metadata", None)) for m in msgs]
    assert any(isinstance(m, ToolMessage) and m.content == "sunny, 21 celsius" for m in msgs)
    assert isinstance(msgs[-1], AIMessage) and not msgs[-1].tool_calls


def test_instructor_json_schema_terminates_without_additional_properties(client):
    """instructor's JSON modes send schemas without additionalProperties: false; graphc closes
    them (runtime/grammar/schema.py), so a reply cannot grow extra keys until max_tokens."""
    r = client.chat.completions.create(
        model="tiny", messages=_messages(), max_tokens=120, temperature=1.0, seed=1,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": Weather.model_json_schema()}})
    assert r.choices[0].finish_reason == "stop"
    assert set(json.loads(r.choices[0].message.content)) <= {"city", "unit", "temperature"}
