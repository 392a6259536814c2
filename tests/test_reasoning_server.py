"""Reasoning through /v1/chat/completions: a tiny model whose tokenizer has `<think>` and
`</think>` tokens (as Qwen3's does) and whose chat templates think — Qwen3-style (the model
opens `<think>`; `enable_thinking=False` closes an empty one in the prompt) and DeepSeek-R1
style (the prompt opens `<think>`, the output only closes it).

Random weights write meaningless text, so the tests check the split against the raw text the
same seeded request gives on /v1/completions, and that structured output holds the answer.
"""

from __future__ import annotations

import json
import shutil

import httpx
import jsonschema
import pytest

from graphc.runtime.server.reasoning import THINK, split_reasoning

QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)
R1_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n<think>\n' }}{%- endif %}"
)
OPEN_ID, CLOSE_ID = 1022, 1023  # the last two BPE merges' tokens, renamed
MSGS = [{"role": "user", "content": "Think, then answer."}]


def thinking_model(src, dst, template: str):
    """A copy of the tiny model folder `src` whose last two vocabulary entries are the added
    tokens `<think>` / `</think>` (their merges dropped, so no other token needs them) and whose
    chat template is `template`."""
    shutil.copytree(src, dst)
    tj = json.loads((dst / "tokenizer.json").read_text())
    vocab, merges = tj["model"]["vocab"], tj["model"]["merges"]
    inv = {v: k for k, v in vocab.items()}
    for tid, text in ((OPEN_ID, THINK.open), (CLOSE_ID, THINK.close)):
        del vocab[inv[tid]]
        vocab[text] = tid
        tj["added_tokens"].append({"id": tid, "content": text, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": False})
    tj["model"]["merges"] = merges[:-2]
    (dst / "tokenizer.json").write_text(json.dumps(tj))
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    for tid, text in ((OPEN_ID, THINK.open), (CLOSE_ID, THINK.close)):
        cfg["added_tokens_decoder"][str(tid)] = {"content": text, "lstrip": False, "normalized": False,
                                                 "rstrip": False, "single_word": False, "special": False}
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def r1(model_dir, tmp_path_factory):
    from server_harness import live_server

    path = thinking_model(model_dir("llama"), tmp_path_factory.mktemp("r1") / "m", R1_TEMPLATE)
    with live_server(path, warmup=False) as s:
        yield s


@pytest.fixture(scope="module")
def qwen3(model_dir, tmp_path_factory):
    from server_harness import live_server

    path = thinking_model(model_dir("llama"), tmp_path_factory.mktemp("qwen3") / "m", QWEN3_TEMPLATE)
    with live_server(path, warmup=False) as s:
        yield s


def _chat(server, **body):
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": MSGS, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(server, **body):
    reasoning, content = "", ""
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60,
                      json={"model": "tiny", "messages": MSGS, "stream": True, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:])["choices"]:
                d = c["delta"]
                reasoning += d.get("reasoning_content", "")
                content += d.get("content", "") or ""
                assert THINK.close not in d.get("reasoning_content", "")
    return reasoning, content


# Seeded sampling with </think> favoured (bias +8 on one token of 1024): the thinking ends
# somewhere inside the reply, so both channels have text.
SAMPLED = {"temperature": 1.0, "seed": 1, "max_tokens": 40, "logit_bias": {str(CLOSE_ID): 8}}


def _raw(server, **body):
    """The same request's unsplit text, through /v1/completions on the chat prompt's ids."""
    state = server.state
    from graphc.runtime.server.protocol import ChatCompletionRequest
    from graphc.runtime.server.prompts import chat_prompt

    ids = chat_prompt(state, ChatCompletionRequest(messages=MSGS))
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": ids, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_r1_prompt_opens_thinking_and_the_reply_splits(r1):
    raw = _raw(r1, **SAMPLED)
    assert THINK.close in raw.strip() and not raw.strip().startswith(THINK.close)  # the seed does what we need
    msg = _chat(r1, **SAMPLED)["choices"][0]["message"]
    want_r, want_a = split_reasoning(raw, THINK, started=True)
    assert (msg["reasoning_content"], msg["content"]) == (want_r, want_a)
    assert want_r and THINK.close not in want_r


def test_r1_stream_matches_the_whole_reply(r1):
    msg = _chat(r1, **SAMPLED)["choices"][0]["message"]
    assert _stream(r1, **SAMPLED) == (msg["reasoning_content"], msg["content"])


SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_binds_the_answer_not_the_thinking(r1, stream):
    body = dict(SAMPLED, max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}})
    if stream:
        reasoning, content = _stream(r1, **body)
    else:
        msg = _chat(r1, **body)["choices"][0]["message"]
        reasoning, content = msg["reasoning_content"], msg["content"]
    jsonschema.validate(json.loads(content), SCHEMA)
    assert reasoning is None or THINK.close not in reasoning


def test_tools_parse_the_answer_after_the_thinking(r1):
    tool = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"]}}}
    body = dict(SAMPLED, max_tokens=80, tools=[tool], tool_choice="required")
    choice = _chat(r1, **body)["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and calls[0]["function"]["name"] == "pick"
    assert json.loads(calls[0]["function"]["arguments"])["n"] in (1, 2)
    assert THINK.close not in (choice["message"]["reasoning_content"] or "")


def test_qwen3_enable_thinking_false_closes_the_thinking_in_the_prompt(qwen3):
    on = _chat(qwen3, max_tokens=1, temperature=0)["usage"]["prompt_tokens"]
    off = _chat(qwen3, max_tokens=1, temperature=0, enable_thinking=False)["usage"]["prompt_tokens"]
    via_kwargs = _chat(qwen3, max_tokens=1, temperature=0,
                       chat_template_kwargs={"enable_thinking": False})["usage"]["prompt_tokens"]
    assert off == via_kwargs > on


def test_qwen3_model_opening_think_is_split(qwen3):
    # </think> and <think> favoured: the model opens the thinking itself (Qwen3 style).
    body = dict(SAMPLED, logit_bias={str(OPEN_ID): 16, str(CLOSE_ID): 8}, max_tokens=30)
    msg = _chat(qwen3, **body)["choices"][0]["message"]
    raw = _raw(qwen3, **body)
    assert raw.startswith(THINK.open)
    assert (msg["reasoning_content"], msg["content"]) == split_reasoning(raw, THINK, started=False)
    assert msg["reasoning_content"] is not None


def test_reserved_template_kwargs_are_refused(qwen3):
    r = httpx.post(qwen3.url + "/v1/chat/completions", timeout=30, json={
        "model": "tiny", "messages": MSGS, "chat_template_kwargs": {"tokenize": False}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"


def test_plain_model_has_no_reasoning_field(client):
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=4, temperature=0)
    assert r.choices[0].message.content is not None
    assert getattr(r.choices[0].message, "reasoning_content", None) is None
