"""The Responses and Messages APIs, and an openai-agents run, on the real SmolLM2-135M-Instruct
(`-m slow`: MLX's CPU quantized matmul makes each token take about a second here).

Greedy answers to "the capital of France" contain Paris through both protocols, forced tool
calls validate through both, and an openai-agents agent calls its tool with the right city.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from real_model import smollm2_gguf

from graphc.compiler.gguf import import_gguf

pytestmark = pytest.mark.slow
Q = [{"role": "user", "content": "What is the capital of France?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from server_harness import live_server

    path, why = smollm2_gguf()
    if path is None:
        pytest.skip(f"SmolLM2 GGUF not available: {why}")
    with live_server(import_gguf(path, tmp_path_factory.mktemp("smollm2") / "model")) as s:
        yield s


def test_responses_and_messages_answer_paris(server, client):
    r = client.responses.create(model="tiny", input=Q, max_output_tokens=12, temperature=0.0)
    assert "Paris" in r.output_text
    anthropic = pytest.importorskip("anthropic")
    ac = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    m = ac.messages.create(model="tiny", max_tokens=12, messages=Q, extra_body={"temperature": 0.0})
    assert "Paris" in m.content[0].text
    assert ac.messages.count_tokens(model="tiny", messages=Q).input_tokens == \
        m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_tool_calls_through_both_protocols(server, client):
    tools = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
              "parameters": CITY}]
    r = client.responses.create(model="tiny", input="What is the weather in Paris?", tools=tools,
                                tool_choice="required", parallel_tool_calls=False, max_output_tokens=30,
                                temperature=0.0)
    (call,) = [o for o in r.output if o.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), CITY)
    anthropic = pytest.importorskip("anthropic")
    ac = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    m = ac.messages.create(model="tiny", max_tokens=30, messages=[{"role": "user", "content": "Weather in Paris?"}],
                           tools=[{"name": "get_weather", "description": "Get the current weather in a city",
                                   "input_schema": CITY}],
                           tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0.0})
    assert m.stop_reason == "tool_use"
    jsonschema.validate(next(b for b in m.content if b.type == "tool_use").input, CITY)


def test_agent_runs_its_tool(server):
    """SmolLM2-135M, greedy, calls the tool again on every later turn (tool_choice auto) rather
    than answer, so the agent stops at the first tool result here; the whole loop to a typed
    answer runs on the tiny model (tests/test_clients_agents.py)."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return "sunny, 21 celsius"

    model = agents.OpenAIResponsesModel(model="tiny", openai_client=AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0))
    agent = agents.Agent(name="weather", tools=[get_weather], model=model, instructions="Use the tool.",
                         tool_use_behavior="stop_on_first_tool",
                         model_settings=agents.ModelSettings(tool_choice="required", max_tokens=60,
                                                             parallel_tool_calls=False, temperature=0.0))
    result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?", max_turns=2))
    assert calls == ["Paris"] and result.final_output == "sunny, 21 celsius"
