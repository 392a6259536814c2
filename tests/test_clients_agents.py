"""The openai-agents SDK against graphc serve over /v1/responses: an agent with one function
tool, run to completion.

The model is the tiny random-weight llama with a tools chat template. The first turn is
forced to call the tool (ModelSettings.tool_choice="required"); the SDK's default
reset_tool_choice then drops the forcing once the tool has run. The agent has an output
type, so every turn sends the tools *and* a JSON-schema text.format: the reply is either
a call or the typed answer, each held to its schema by the grammar, so the loop ends in
an answer the SDK validates (free text from random weights would run to max_tokens,
which the SDK treats as a failed turn). What is checked is that the SDK's own parsing,
tool dispatch and loop accept what the server returns. Tracing is off (it would try to
reach api.openai.com).
"""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
from pydantic import BaseModel

agents = pytest.importorskip("agents")

from openai import AsyncOpenAI  # noqa: E402 - after the importorskip of the SDK that needs it

from server_harness import MODEL, live_server  # noqa: E402


@pytest.fixture(scope="module")
def server(model_dir):
    with live_server(model_dir("llama", chat_template="tools")) as s:
        yield s


class Report(BaseModel):
    sky: Literal["sunny", "rain"]


def _agent(server, calls: list, seed: int):
    @agents.function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
        """Current weather in a city."""
        calls.append(city)
        return "sunny, 21 celsius"

    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
    settings = agents.ModelSettings(tool_choice="required", max_tokens=100, temperature=1.0,
                                    extra_body={"seed": seed})
    return agents.Agent(name="weather", instructions="Answer weather questions with the tool.", tools=[get_weather],
                        model=model, model_settings=settings, output_type=Report)


def test_agent_calls_its_tool_and_finishes(server):
    agents.set_tracing_disabled(True)
    calls: list = []
    result = asyncio.run(agents.Runner.run(_agent(server, calls, seed=1), "Weather in Paris?", max_turns=8))
    assert len(calls) >= 1 and set(calls) <= {"Paris", "Oslo", "Lima"}
    assert isinstance(result.final_output, Report)
    kinds = [type(i).__name__ for i in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem"
    assert all(r.usage.input_tokens > 0 for r in result.raw_responses)


def test_agent_streamed_run(server):
    agents.set_tracing_disabled(True)
    calls: list = []

    async def run():
        r = agents.Runner.run_streamed(_agent(server, calls, seed=1), "Weather in Paris?", max_turns=8)
        kinds = [e.type async for e in r.stream_events()]
        return r, kinds

    result, kinds = asyncio.run(run())
    assert calls and "raw_response_event" in kinds and isinstance(result.final_output, Report)
