"""Structured output with llguidance: outputs parse and validate even on a random-weight model."""

from __future__ import annotations

import json
import re

import pytest

from graphc.runtime import Engine, SamplingParams
from graphc.runtime.grammar import Grammar, GrammarError
from helpers import reference_greedy

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
PROMPTS = ["hello", "hi there", "abc", "x", "the cat", "once upon a time"]


def check_schema(doc):
    assert set(doc) == {"name", "age", "tags", "ok"}
    assert isinstance(doc["name"], str) and len(doc["name"]) <= 8
    assert isinstance(doc["age"], int) and 0 <= doc["age"] <= 120
    assert isinstance(doc["tags"], list) and len(doc["tags"]) <= 3 and set(doc["tags"]) <= {"a", "b", "c"}
    assert isinstance(doc["ok"], bool)


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine.load(model_dir("llama"))


def test_json_schema_outputs_parse_and_validate(engine):
    res = engine.generate(PROMPTS, SamplingParams(max_tokens=120, grammar=Grammar.json_schema(SCHEMA)))
    for r in res:
        assert r.finish_reason == "stop", r.text
        check_schema(json.loads(r.text))


def test_sampled_json_schema_outputs_validate_too(engine):
    ps = [SamplingParams(max_tokens=120, temperature=1.0, seed=i, grammar=Grammar.json_schema(SCHEMA)) for i in range(6)]
    for r in engine.generate(PROMPTS, ps):
        check_schema(json.loads(r.text))


def test_regex_and_lark(engine):
    pattern = r"(yes|no), [a-z]{1,5}!"
    for r in engine.generate(PROMPTS, SamplingParams(max_tokens=30, grammar=Grammar.regex(pattern))):
        assert re.fullmatch(pattern, r.text), r.text
    lark = 'start: "(" NUM ("+" NUM)? ")"\nNUM: /[0-9]{1,3}/'
    for r in engine.generate(PROMPTS[:3], SamplingParams(max_tokens=30, grammar=Grammar.lark(lark))):
        assert re.fullmatch(r"\([0-9]{1,3}(\+[0-9]{1,3})?\)", r.text), r.text


def test_any_json_object_is_json_when_it_stops(engine):
    for r in engine.generate(PROMPTS, SamplingParams(max_tokens=40, grammar=Grammar.json_object())):
        if r.finish_reason == "stop":
            assert isinstance(json.loads(r.text), dict)
        else:  # cut by max_tokens: reported, never silently invalid
            assert r.finish_reason == "length"


def test_bad_grammar_is_a_clean_request_error(engine):
    before = dict(engine.scheduler.by_id)
    with pytest.raises(GrammarError, match="does not compile"):
        engine.add_request("hi", SamplingParams(grammar=Grammar.lark("start: (")))
    with pytest.raises(ValueError, match="not valid JSON"):
        Grammar.json_schema("{nope")
    assert engine.scheduler.by_id == before and not engine.has_unfinished()


def test_grammar_rows_do_not_change_other_rows_and_never_chain(engine):
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13]]
    ps = [SamplingParams(max_tokens=12, ignore_eos=True),
          SamplingParams(max_tokens=120, grammar=Grammar.json_schema(SCHEMA)),
          SamplingParams(max_tokens=12, ignore_eos=True)]
    rid = [engine.add_request(p, sp) for p, sp in zip(prompts, ps)]
    chained_with_grammar = 0
    outs = {i: [] for i in rid}
    while engine.has_unfinished():
        for o in engine.step():
            outs[o.request_id] += o.new_token_ids
        if engine.runner.pending is not None and any(r.grammar is not None for r in engine.runner.pending.rows):
            chained_with_grammar += 1
    assert chained_with_grammar == 0
    assert outs[rid[0]] == reference_greedy(engine.model, prompts[0], 12)
    assert outs[rid[2]] == reference_greedy(engine.model, prompts[2], 12)
    check_schema(json.loads(engine.tokenizer.decode(outs[rid[1]])))
