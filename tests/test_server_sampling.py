"""Every sampling field of the API reaches the engine and does what it says.

Greedy references come from the same server (temperature 0).
"""

from __future__ import annotations

import collections
import json

import pytest

from graphc.runtime import Engine, SamplingParams
from server_harness import MODEL

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "Tell me a story."}]
N = 16

def complete(client, **kw):
    extra = kw.pop("extra_body", {})
    kw.setdefault("max_tokens", N)
    return client.completions.create(model=MODEL, prompt=kw.pop("prompt", PROMPT),
                                     extra_body={"ignore_eos": True, **extra}, **kw)


def joined(tokens: list[str]) -> str:
    """The text that completions' logprob tokens spell: `bytes:\\xNN...` tokens (partial UTF-8,
    OpenAI's spelling) are their bytes, joined with the neighbours before decoding."""
    raw = b""
    for t in tokens:
        raw += bytes.fromhex(t[6:].replace("\\x", "")) if t.startswith("bytes:") else t.encode()
    return raw.decode("utf-8", errors="replace")


def shown_len(t: str) -> int:
    """How many characters a logprob token adds to text_offset: a `bytes:` token counts as
    the U+FFFD characters its bytes print as alone."""
    return len(joined([t]))


def tokens_of(client, **kw):
    """The completion text (equal texts stand for equal tokens: the tokenizer is deterministic)."""
    return complete(client, **kw).choices[0].text


@pytest.fixture(scope="module")
def greedy(client):
    return tokens_of(client, temperature=0)


# -- selection ------------------------------------------------------------------------------
def test_temperature_samples_away_from_greedy(client, greedy):
    outs = {tokens_of(client, temperature=2.0, seed=s) for s in range(3)}
    assert greedy not in outs or len(outs) > 1


def test_seed_is_reproducible_and_different_seeds_differ(client):
    # Alternate seeds for a few rounds: each seed must give its own output every time (this caught
    # the sampler cache reusing a finished request's tensors for a new one at the same id()).
    outs = {1234: set(), 99: set()}
    for _ in range(4):
        for seed in outs:
            outs[seed].add(tokens_of(client, temperature=1.5, seed=seed))
    assert all(len(v) == 1 for v in outs.values()), outs
    assert outs[1234] != outs[99]


def test_seeded_request_is_reproducible(client):
    assert tokens_of(client, temperature=1.0, seed=7) == tokens_of(client, temperature=1.0, seed=7)


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


def test_top_k_limits_the_draw(client, greedy):
    # top_k=2 at a high temperature: some token differs from greedy, but sampling many tokens
    # from all 1024 (top_k off) differs more often.
    wide = [tokens_of(client, temperature=5.0, seed=s) for s in range(3)]
    narrow = [tokens_of(client, temperature=5.0, seed=s, extra_body={"top_k": 2}) for s in range(3)]
    assert narrow != wide


# -- penalties ------------------------------------------------------------------------------
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
def test_logit_bias_forces_a_token(client, server):
    tok = 300
    text = server.state.tokenizer.decode([tok])
    out = tokens_of(client, temperature=0, logit_bias={str(tok): 100}, max_tokens=4)
    assert out == text * 4


def test_logit_bias_bans_the_greedy_token(client, model_dir):
    ids = [5, 17, 300, 42]
    engine = Engine.load(model_dir("llama"))
    [ref] = engine.generate([ids], SamplingParams(max_tokens=2, ignore_eos=True))
    first = ref.token_ids[0]
    r = complete(client, prompt=ids, temperature=0, logit_bias={str(first): -100}, max_tokens=2, logprobs=0)
    banned = complete(client, prompt=ids, temperature=0, max_tokens=2, logprobs=0)
    assert r.choices[0].logprobs.token_logprobs[0] != banned.choices[0].logprobs.token_logprobs[0]
    [again] = engine.generate([ids], SamplingParams(max_tokens=2, ignore_eos=True, logit_bias={first: -100}))
    assert again.token_ids[0] != first and r.choices[0].text == again.text


def test_min_tokens_holds_back_eos(client, server):
    eos = min(server.state.engine.eos_token_ids)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0,
                                  logit_bias={str(eos): 100}, extra_body={"min_tokens": 5})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 6  # five forced non-EOS tokens, then the EOS


# -- logprobs --------------------------------------------------------------------------------
def test_completion_logprobs(client):
    r = complete(client, temperature=0, logprobs=3, max_tokens=6)
    lp = r.choices[0].logprobs
    assert lp is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert joined(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(shown_len(t) for t in lp.tokens[:i]) for i in range(6)]
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and 1 <= len(top) <= 3
        assert abs(max(top.values()) - chosen) < 1e-4  # greedy picks the most likely token


def test_completion_logprobs_stream(client):
    chunks = list(complete(client, temperature=0, logprobs=2, max_tokens=5, stream=True))
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert len(tokens) == 5
    assert joined(tokens) == "".join(c.choices[0].text for c in chunks)


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
    # A token may hold part of a UTF-8 character; its bytes are the raw ones, so they join up.
    assert bytes(b for t in content for b in t.bytes).decode() == r.choices[0].message.content


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


def test_logprob_bytes_of_partial_utf8_tokens(server):
    texts = server.state.texts
    tok = server.state.tokenizer
    partial = [i for i in range(server.state.vocab_size) if "\ufffd" in texts.text(i)][:20]
    assert partial  # the byte-level BPE vocabulary has tokens for lone UTF-8 bytes
    for i in partial:
        assert 1 <= len(texts.bytes(i)) <= 4 and all(0 <= b < 256 for b in texts.bytes(i))
    euro = tok.encode("€")  # 3 UTF-8 bytes, split over tokens by this tiny vocabulary
    assert bytes(b for t in euro for b in texts.bytes(t)) == "€".encode()


def test_echo_logprobs_scores_the_prompt(client, server, model_dir):
    """echo + logprobs + max_tokens 0: the prompt's log-likelihood (lm-eval-harness's request)."""
    import mlx.core as mx
    import mlx_lm

    from helpers import reference_logits

    ids = [5, 17, 300, 42, 7, 99]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0)
    c = r.choices[0]
    lp = c.logprobs
    assert r.usage.completion_tokens == 0 and c.text == server.state.tokenizer.decode(ids)
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    model, _ = mlx_lm.load(str(model_dir("llama")))
    ref = reference_logits(model, ids)
    ref = (ref - mx.logsumexp(ref, axis=-1, keepdims=True)).tolist()
    for i in range(1, len(ids)):
        assert abs(lp.token_logprobs[i] - ref[i - 1][ids[i]]) < 1e-3
        assert len(lp.top_logprobs[i]) == 1
    # With a completion too: prompt entries, then the generated ones, offsets running on.
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, echo=True, logprobs=2, temperature=0,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 3 and joined(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(shown_len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
