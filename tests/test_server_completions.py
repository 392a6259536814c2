"""/v1/completions and /v1/models through the official openai client against a live server."""

from __future__ import annotations

import openai
import pytest

from graphc.runtime import Engine, SamplingParams
from server_harness import MODEL

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def reference(model_dir):
    """Greedy continuations straight from an Engine (no server), the ground truth here."""
    engine = Engine.load(model_dir("llama"))

    def ref(prompt, n=8, **kw):
        [r] = engine.generate([prompt], SamplingParams(max_tokens=n, **kw))
        return r

    return ref


def test_models_lists_the_served_model(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_text_prompt_greedy_matches_engine(client, reference):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    ref = reference(PROMPT, 8, ignore_eos=True)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    [c] = r.choices
    assert c.text == ref.text and c.index == 0 and c.finish_reason == "length"
    assert r.usage.prompt_tokens == len(ref.prompt_ids)
    assert r.usage.completion_tokens == 8
    assert r.usage.total_tokens == len(ref.prompt_ids) + 8
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_token_id_prompt_and_lists_of_prompts(client, reference):
    ids = [5, 17, 300, 42]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == reference(ids, 6, ignore_eos=True).text
    prompts = [PROMPT, "The cat", "A"]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [reference(p, 5, ignore_eos=True).text for p in prompts]
    id_lists = [[9, 8, 7], [100, 200]]
    r = client.completions.create(model=MODEL, prompt=id_lists, max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert [c.text for c in r.choices] == [reference(p, 4, ignore_eos=True).text for p in id_lists]
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 8


def test_n_choices_numbered_prompt_major(client):
    r = client.completions.create(model=MODEL, prompt=["one", "two"], n=3, max_tokens=3, temperature=0)
    assert [c.index for c in r.choices] == list(range(6))
    # Greedy: every choice of a prompt is the same text.
    assert len({c.text for c in r.choices[:3]}) == 1 and len({c.text for c in r.choices[3:]}) == 1


def test_default_max_tokens_is_16(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16


def test_stop_string_cuts_the_text(client, reference):
    full = reference(PROMPT, 12, ignore_eos=True).text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), full
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop,
                                  extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert c.text == full[:full.index(stop)]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                  stop=["\x00never", stop], extra_body={"ignore_eos": True})
    assert r.choices[0].text == full[:full.index(stop)]
    # an empty stop string stops nothing (every text "starts" with it): ignored, not a stop at token 0
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[""],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == full and r.choices[0].finish_reason == "length"


def test_stop_token_ids(client, reference):
    ref = reference(PROMPT, 8, ignore_eos=True)
    stop_tok = ref.token_ids[2]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                  extra_body={"stop_token_ids": [stop_tok], "ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == ref.token_ids.index(stop_tok) + 1


def test_echo_prepends_the_prompt(client, reference):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == PROMPT + reference(PROMPT, 4, ignore_eos=True).text


def test_stream_deltas_concatenate_to_the_full_text(client, reference):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert all(c.object == "text_completion" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].text for c in chunks) == reference(PROMPT, 10, ignore_eos=True).text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert all(c.usage is None for c in chunks)


def test_stream_include_usage_and_n(client):
    chunks = list(client.completions.create(model=MODEL, prompt=[PROMPT, "Hi"], n=2, max_tokens=5, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 4 * 5
    assert last.usage.prompt_tokens_details.cached_tokens >= 0
    assert all(c.usage is None for c in body)
    texts = {}
    for c in body:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    assert sorted(texts) == [0, 1, 2, 3]
    assert texts[0] == texts[1] and texts[2] == texts[3]
    finished = [ch.index for c in body for ch in c.choices if ch.finish_reason]
    assert sorted(finished) == [0, 1, 2, 3]
