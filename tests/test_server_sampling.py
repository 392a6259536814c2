"""Every sampling field of the API reaches the engine and does what it says.

Greedy references come from the same server (temperature 0). Tests whose feature the
engine does not run yet are marked xfail (see PENDING_*) so they flip to passing once wired.
"""

from __future__ import annotations

import collections
import json

import openai
import pytest

from server_harness import MODEL, live_server

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Tell me a story."}]
N = 16

# Engine features not wired when these tests were written; strict=False so they pass once wired.
PENDING_SAMPLING = pytest.mark.xfail(reason="engine runs greedy only: temperature/seed sampling not wired yet",
                                     strict=False)
PENDING_PENALTIES = pytest.mark.xfail(reason="penalties not wired into the engine yet", strict=False)
PENDING_BIAS = pytest.mark.xfail(reason="logit_bias / min_tokens not wired into the engine yet", strict=False)
PENDING_LOGPROBS = pytest.mark.xfail(reason="the engine does not report logprobs yet", strict=False)


@pytest.fixture(scope="module")
def server(model_dir):
    with live_server(model_dir("llama")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def complete(client, **kw):
    extra = kw.pop("extra_body", {})
    kw.setdefault("max_tokens", N)
    return client.completions.create(model=MODEL, prompt=kw.pop("prompt", PROMPT),
                                     extra_body={"ignore_eos": True, **extra}, **kw)


def tokens_of(client, **kw):
    """The completion text (equal texts stand for equal tokens: the tokenizer is deterministic)."""
    return complete(client, **kw).choices[0].text


@pytest.fixture(scope="module")
def greedy(client):
    return tokens_of(client, temperature=0)


# -- selection ------------------------------------------------------------------------------
@PENDING_SAMPLING
def test_temperature_samples_away_from_greedy(client, greedy):
    outs = {tokens_of(client, temperature=2.0, seed=s) for s in range(3)}
    assert greedy not in outs or len(outs) > 1


@PENDING_SAMPLING
def test_seed_is_reproducible_and_different_seeds_differ(client):
    a = tokens_of(client, temperature=1.5, seed=1234)
    b = tokens_of(client, temperature=1.5, seed=1234)
    c = tokens_of(client, temperature=1.5, seed=99)
    assert a == b
    assert a != c


def test_seeded_request_is_reproducible(client):
    # Holds whether or not sampling is wired: same seed, same output.
    assert tokens_of(client, temperature=1.0, seed=7) == tokens_of(client, temperature=1.0, seed=7)


@PENDING_SAMPLING
def test_n_with_seed_gives_distinct_reproducible_choices(client):
    r1 = complete(client, temperature=1.5, seed=5, n=3)
    r2 = complete(client, temperature=1.5, seed=5, n=3)
    t1 = [c.text for c in r1.choices]
    assert t1 == [c.text for c in r2.choices]
    assert len(set(t1)) > 1


def test_top_k_1_is_greedy(client, greedy):
    assert tokens_of(client, temperature=2.0, seed=3, extra_body={"top_k": 1}) == greedy


def test_tiny_top_p_is_greedy(client, greedy):
    assert tokens_of(client, temperature=2.0, top_p=1e-6, seed=3) == greedy


def test_min_p_1_is_greedy(client, greedy):
    assert tokens_of(client, temperature=2.0, seed=3, extra_body={"min_p": 1.0}) == greedy


@PENDING_SAMPLING
def test_top_k_limits_the_draw(client, greedy):
    # top_k=2 at a high temperature: some token differs from greedy, but sampling many tokens
    # from all 1024 (top_k off) differs more often.
    wide = [tokens_of(client, temperature=5.0, seed=s) for s in range(3)]
    narrow = [tokens_of(client, temperature=5.0, seed=s, extra_body={"top_k": 2}) for s in range(3)]
    assert narrow != wide


# -- penalties ------------------------------------------------------------------------------
@PENDING_PENALTIES
@pytest.mark.parametrize("field,value", [("frequency_penalty", 2.0), ("presence_penalty", 2.0),
                                         ("repetition_penalty", 10.0)])
def test_penalties_reduce_repetition(client, greedy, field, value):
    # The tiny random model repeats tokens under greedy decoding ("comm comm comm ...").
    kw = {field: value} if field != "repetition_penalty" else {"extra_body": {field: value}}
    penalized = tokens_of(client, temperature=0, **kw)
    assert penalized != greedy
    words = collections.Counter(greedy.split())
    assert max(collections.Counter(penalized.split()).values()) <= max(words.values())


# -- logit_bias / min_tokens -----------------------------------------------------------------
@PENDING_BIAS
def test_logit_bias_forces_a_token(client, server):
    tok = 300
    text = server.state.tokenizer.decode([tok])
    out = tokens_of(client, temperature=0, logit_bias={str(tok): 100}, max_tokens=4)
    assert out == text * 4


@PENDING_BIAS
def test_logit_bias_bans_the_greedy_token(client, server, greedy):
    first = server.state.tokenizer.encode(greedy)[0]
    out = tokens_of(client, temperature=0, logit_bias={str(first): -100}, max_tokens=2)
    assert not out.startswith(server.state.tokenizer.decode([first]))


@PENDING_BIAS
def test_min_tokens_holds_back_eos(client, server):
    eos = min(server.state.engine.eos_token_ids)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0,
                                  logit_bias={str(eos): 100}, extra_body={"min_tokens": 5})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 6  # five forced non-EOS tokens, then the EOS


# -- logprobs --------------------------------------------------------------------------------
@PENDING_LOGPROBS
def test_completion_logprobs(client):
    r = complete(client, temperature=0, logprobs=3, max_tokens=6)
    lp = r.choices[0].logprobs
    assert lp is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and 1 <= len(top) <= 3
        assert abs(max(top.values()) - chosen) < 1e-4  # greedy picks the most likely token


@PENDING_LOGPROBS
def test_completion_logprobs_stream(client):
    chunks = list(complete(client, temperature=0, logprobs=2, max_tokens=5, stream=True))
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert len(tokens) == 5
    assert "".join(tokens) == "".join(c.choices[0].text for c in chunks)


@PENDING_LOGPROBS
def test_chat_logprobs_and_top_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=2, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4
        assert bytes(t.bytes).decode() == t.token


@PENDING_LOGPROBS
def test_chat_logprobs_stream(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0,
                                                 logprobs=True, stream=True, extra_body={"ignore_eos": True}))
    entries = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert len(entries) == 4 and all(t.top_logprobs == [] for t in entries)


def test_no_logprobs_unless_asked(client):
    assert complete(client, temperature=0, max_tokens=2).choices[0].logprobs is None
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, temperature=0)
    assert r.choices[0].logprobs is None


# -- structured output -----------------------------------------------------------------------
# Bounded values only: a random model would write an integer or string until max_tokens.
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2, 3]},
                                           "ok": {"type": "boolean"}},
          "required": ["color", "size", "ok"], "additionalProperties": False}


def test_response_format_json_schema(client):
    r = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c.message.content
    doc = json.loads(c.message.content)
    assert set(doc) == {"color", "size", "ok"} and doc["color"] in ("red", "green", "blue")
    assert doc["size"] in (1, 2, 3) and isinstance(doc["ok"], bool)


def test_response_format_json_schema_on_completions_stream(client):
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}}))
    text = "".join(c.choices[0].text for c in chunks)
    assert json.loads(text)["color"] in ("red", "green", "blue")


def test_response_format_json_object(client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=60, temperature=0,
                                       response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":  # a random model may not close the object within 60 tokens
        assert isinstance(json.loads(text), dict)


def test_response_format_text_is_unconstrained(client, greedy):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0,
                                       response_format={"type": "text"})
    assert r.choices[0].finish_reason in ("length", "stop")
