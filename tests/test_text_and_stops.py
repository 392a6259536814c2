"""Stops and text: stop strings across token boundaries, stop ids, EOS, UTF-8-safe streaming."""

from __future__ import annotations

import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.text import TextState
from helpers import reference_greedy


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine.load(model_dir("llama"))


def stream(engine, prompt, params):
    rid = engine.add_request(prompt, params)
    text, ids, last = "", [], None
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid:
                text += o.new_text
                ids += o.new_token_ids
                last = o
    return text, ids, last


def test_streamed_utf8_never_breaks_a_character(engine):
    tok = engine.tokenizer
    s = "héllo wörld — 日本語 ünïcödé ✓ 🙂"
    ids = tok.encode(s, add_special_tokens=False)
    # Byte-level BPE splits some of these characters over several tokens.
    assert any("\ufffd" in tok.decode([t]) for t in ids)
    state, out = TextState(tok), ""
    for t in ids:
        state.add(t)
        piece = state.ready()
        assert "\ufffd" not in piece
        out += piece
    out += state.flush()
    assert out == tok.decode(ids)


def test_stop_string_spanning_token_boundary_in_text_state(engine):
    tok = engine.tokenizer
    ids = tok.encode("hello world, the quick brown fox", add_special_tokens=False)
    full = tok.decode(ids)
    cut = len(tok.decode(ids[:3]))
    stop = full[cut - 2: cut + 2]  # the end of token 3's text and the start of token 4's
    state, shown = TextState(tok, (stop,)), ""
    for n, t in enumerate(ids, 1):
        hit = state.add(t)
        shown += state.ready()
        if hit:
            break
    assert hit and n == 4
    shown += state.flush()
    assert shown == full[: full.find(stop)] and stop not in shown


def _printable_greedy(engine, n):
    """A prompt whose greedy continuation decodes to clean text (random models often emit byte pieces)."""
    for seed in range(60):
        prompt = [3 + (seed * 7 + i * 13) % (engine.vocab_size - 3) for i in range(6)]
        ref = reference_greedy(engine.model, prompt, n)
        pieces = [engine.tokenizer.decode(ref[: i + 1]) for i in range(n)]
        if "\ufffd" not in pieces[-1] and all(len(pieces[i]) < len(pieces[i + 1]) for i in range(6)):
            return prompt, ref, pieces
    pytest.skip("no prompt with a clean greedy continuation")


def test_stop_string_spanning_token_boundary(engine):
    prompt, ref_ids, pieces = _printable_greedy(engine, 24)
    full = pieces[-1]
    cut = len(pieces[4])
    stop = full[cut - 1: cut + 1]  # last char of token 5's text + first char of token 6's
    first = full.find(stop)
    text, ids, last = stream(engine, prompt, SamplingParams(max_tokens=24, stop=(stop,), ignore_eos=True))
    assert last.finished and last.finish_reason == "stop"
    assert text == full[:first] and stop not in text
    assert ids == ref_ids[: len(ids)] and len(ids) <= 6


def test_stop_token_ids_and_eos(engine):
    prompt = [21, 22, 23]
    ref_ids = reference_greedy(engine.model, prompt, 16)
    stop_id = ref_ids[3]
    first = ref_ids.index(stop_id)
    [res] = engine.generate([prompt], SamplingParams(max_tokens=16, stop_token_ids=(stop_id,), ignore_eos=True))
    assert res.finish_reason == "stop" and res.token_ids == ref_ids[: first + 1]
    # The tokenizer's EOS stops unless ignore_eos.
    eos = next(iter(engine.eos_token_ids))
    [res] = engine.generate([prompt], SamplingParams(max_tokens=16, logit_bias={eos: 100.0}))
    assert res.token_ids[-1] == eos and res.finish_reason == "stop" or res.finish_reason == "length"


def test_text_equals_stream_and_decode(engine):
    prompt = "Once upon a time"
    text, ids, last = stream(engine, prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    assert last.finish_reason == "length" and len(ids) == 20
    assert text == engine.tokenizer.decode(ids)


def test_byte_table_detokenization_equals_tokenizer_decode(engine):
    import random

    from graphc.runtime.text import token_bytes_table

    tok = engine.tokenizer
    table = token_bytes_table(tok)
    assert table is not None  # the test tokenizers are byte-level BPE
    rng = random.Random(0)
    vocab = len(table)
    for _ in range(200):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        fast, slow = TextState(tok, table=table), TextState(tok)
        shown_fast = shown_slow = ""
        for t in ids:
            fast.add(t)
            slow.add(t)
            shown_fast += fast.ready()
            shown_slow += slow.ready()
        shown_fast += fast.flush()
        assert shown_fast == tok.decode(ids)


def test_stop_token_is_in_ids_but_not_in_text(engine):
    eos = min(engine.eos_token_ids)
    [r] = engine.generate([[9, 10, 11]], SamplingParams(max_tokens=20, logit_bias={eos: 50.0}, min_tokens=2))
    assert r.token_ids[-1] == eos and r.finish_reason == "stop"
    assert r.text == engine.tokenizer.decode(r.token_ids[:-1])
