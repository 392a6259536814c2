"""Reasoning through /v1/responses (reasoning items) and /v1/messages (thinking blocks).

The tiny model gets `<think>` / `</think>` tokens and a DeepSeek-R1-style template (the
prompt opens the thinking; tests/test_reasoning_server.py builds it). Random weights write
noise, so each reply is checked against the same seeded request's unsplit text from
/v1/completions: the reasoning and the answer must be exactly its two halves, whole and
streamed, with no tag in the reasoning.
"""

from __future__ import annotations

import httpx
import pytest

from graphc.runtime.server.prompts import chat_prompt
from graphc.runtime.server.protocol import ChatCompletionRequest
from graphc.runtime.server.reasoning import THINK, split_reasoning
from server_harness import MODEL, live_server
from test_reasoning_server import CLOSE_ID, MSGS, R1_TEMPLATE, thinking_model

anthropic = pytest.importorskip("anthropic")

# Seeded, with </think> favoured: the thinking ends inside the reply, so both halves have text.
SAMPLED = {"temperature": 1.0, "seed": 1, "logit_bias": {str(CLOSE_ID): 8}}
BUDGET = 40


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    path = thinking_model(model_dir("llama"), tmp_path_factory.mktemp("r1") / "m", R1_TEMPLATE)
    with live_server(path, warmup=False) as s:
        yield s


@pytest.fixture(scope="module")
def halves(server):
    """(reasoning, answer) of the unsplit text the same request gives on /v1/completions."""
    ids = chat_prompt(server.state, ChatCompletionRequest(messages=MSGS))
    r = httpx.post(server.url + "/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": ids, "max_tokens": BUDGET, **SAMPLED})
    reasoning, answer = split_reasoning(r.json()["choices"][0]["text"], server.state.reasoning, started=True)
    assert reasoning and answer  # the bias makes the thinking end inside the budget
    return reasoning, answer


def test_responses_reasoning_item(client, halves):
    r = client.responses.create(model=MODEL, input=MSGS, max_output_tokens=BUDGET, temperature=1.0,
                                extra_body={"seed": 1, "logit_bias": SAMPLED["logit_bias"]})
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "message"]
    assert r.output[0].content[0].text == halves[0] and r.output_text == halves[1]
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens


def test_responses_streamed_reasoning(client, halves):
    events = list(client.responses.create(model=MODEL, input=MSGS, max_output_tokens=BUDGET, temperature=1.0,
                                          stream=True, extra_body={"seed": 1, "logit_bias": SAMPLED["logit_bias"]}))
    kinds = [e.type for e in events]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "reasoning"
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, text) == halves and THINK.close not in thought  # later tags are answer text
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert done.text == thought
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.content_part.added")


@pytest.fixture(scope="module")
def ac(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def test_messages_thinking_block(ac, halves):
    m = ac.messages.create(model=MODEL, max_tokens=BUDGET, messages=MSGS, extra_body=SAMPLED)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert (m.content[0].thinking, m.content[1].text) == halves


def test_messages_streamed_thinking(ac, halves):
    with ac.messages.stream(model=MODEL, max_tokens=BUDGET, messages=MSGS, extra_body=SAMPLED) as s:
        events = list(s)
        final = s.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    thought = "".join(d.thinking for d in deltas if d.type == "thinking_delta")
    text = "".join(d.text for d in deltas if d.type == "text_delta")
    assert (thought, text) == halves
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == thought


def test_thinking_switch_is_checked(server):
    r = httpx.post(server.url + "/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": MSGS,
                                                       "thinking": {"type": "sometimes"}})
    assert r.status_code == 400 and "thinking" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/responses", json={"model": MODEL, "input": "x", "reasoning": {"effort": "huge"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning"


def test_thinking_that_uses_the_budget_is_the_whole_reply(client, ac):
    """The thinking never closes within max tokens: the reply is the reasoning item / thinking
    block alone, whole and streamed, with no empty message or text block after it (as OpenAI and
    Anthropic answer)."""
    never = {"temperature": 1.0, "seed": 2, "logit_bias": {str(CLOSE_ID): -100}}
    r = client.responses.create(model=MODEL, input=MSGS, max_output_tokens=6, temperature=1.0,
                                extra_body={"seed": 2, "logit_bias": never["logit_bias"]})
    assert [o.type for o in r.output] == ["reasoning"] and r.status == "incomplete" and r.output_text == ""
    events = list(client.responses.create(model=MODEL, input=MSGS, max_output_tokens=6, temperature=1.0,
                                          stream=True, extra_body={"seed": 2, "logit_bias": never["logit_bias"]}))
    assert [o.type for o in events[-1].response.output] == ["reasoning"]
    assert not any(e.type == "response.content_part.added" for e in events)
    m = ac.messages.create(model=MODEL, max_tokens=6, messages=MSGS, extra_body=never)
    assert [b.type for b in m.content] == ["thinking"] and m.stop_reason == "max_tokens"
    with ac.messages.stream(model=MODEL, max_tokens=6, messages=MSGS, extra_body=never) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking"] and final.content[0].thinking == m.content[0].thinking
