"""/v1/chat/completions through the official openai client: the model's chat template, n, streaming."""

from __future__ import annotations

import pytest

from graphc.runtime import Engine, SamplingParams
from server_harness import MODEL

MESSAGES = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me one."}]


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine.load(model_dir("llama"))


def templated(engine, messages):
    return engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)


def test_chat_uses_the_models_chat_template(client, engine):
    ids = templated(engine, MESSAGES)
    [ref] = engine.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True))
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    [c] = r.choices
    assert c.message.role == "assistant" and c.message.content == ref.text
    assert c.finish_reason == "length"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_text_parts_and_developer_role(client, engine):
    parts = [{"role": "developer", "content": "You tell stories."},
             {"role": "user", "content": [{"type": "text", "text": "Tell me one."}]}]
    a = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=5, temperature=0)
    b = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_max_completion_tokens_wins_over_max_tokens(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=9, max_completion_tokens=3,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_n_choices_each_end_at_the_stop_string(client, engine):
    ids = templated(engine, MESSAGES)
    [ref] = engine.generate([ids], SamplingParams(max_tokens=12, ignore_eos=True))
    stop = ref.text[4:7]
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=3, max_tokens=12, temperature=0,
                                       stop=[stop], extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        assert c.message.content == ref.text[:ref.text.index(stop)] and c.finish_reason == "stop"


def test_stream_chunks_follow_openai_order(client, engine):
    ids = templated(engine, MESSAGES)
    [ref] = engine.generate([ids], SamplingParams(max_tokens=6, ignore_eos=True))
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    first, *mid, fin, usage = chunks
    assert first.choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in mid) == ref.text
    assert all(c.choices[0].finish_reason is None for c in [first, *mid])
    assert fin.choices[0].finish_reason == "length" and not fin.choices[0].delta.content
    assert usage.choices == [] and usage.usage.completion_tokens == 6
    assert usage.usage.prompt_tokens == len(ids)


def test_stream_n_interleaves_choices(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, max_tokens=4,
                                                 temperature=0, stream=True))
    texts, roles, done = {}, set(), set()
    for c in chunks:
        for ch in c.choices:
            if ch.delta.role:
                roles.add(ch.index)
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                done.add(ch.index)
    assert roles == done == {0, 1} and texts[0] == texts[1]


def test_continue_final_message(client, engine):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Once"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, temperature=0,
                                       extra_body={"add_generation_prompt": False, "continue_final_message": True})
    ids = engine.tokenizer.apply_chat_template(msgs, add_generation_prompt=False, continue_final_message=True,
                                               tokenize=True)
    assert r.usage.prompt_tokens == len(ids)
