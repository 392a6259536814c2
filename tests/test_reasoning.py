"""The reasoning splitter (runtime/server/reasoning.py): whole replies, streams cut at every
place (tags split across deltas never leak), detection, template switches, and grammars that
bind only after `</think>`."""

from __future__ import annotations

import json
import random

import pytest

from graphc.runtime.grammar import Grammar
from graphc.runtime.server.reasoning import (THINK, ReasoningStream, answer_grammar, detect_reasoning,
                                             opens_reasoning, split_reasoning, template_kwargs)

CASES = [
    # (text, started, reasoning, answer)
    ("<think>\nplan it\n</think>\n\nThe answer.", False, "plan it", "The answer."),
    ("  <think>a</think>b", False, "a", "b"),
    ("<think></think>b", False, "", "b"),
    ("no thinking here", False, None, "no thinking here"),
    ("  leading space kept", False, None, "  leading space kept"),
    ("an answer quoting <think>tags</think>", False, None, "an answer quoting <think>tags</think>"),
    ("<thi", False, None, "<thi"),  # a bare prefix of the tag was text after all
    ("<think>cut short by max_tokens", False, "cut short by max_tokens", ""),
    ("<think>cut short </thi", False, "cut short </thi", ""),
    # DeepSeek-R1: the prompt opened <think>, the output only closes it
    ("\nthe steps\n</think>\n\n42", True, "the steps", "42"),
    ("still thinking", True, "still thinking", ""),
    ("</think>direct", True, "", "direct"),
    ("a < b </ c </think> x </think> y", True, "a < b </ c", "x </think> y"),
]


@pytest.mark.parametrize("text,started,reasoning,answer", CASES)
def test_split_whole_reply(text, started, reasoning, answer):
    assert split_reasoning(text, THINK, started=started) == (reasoning, answer)


def _stream(pieces, started):
    s = ReasoningStream(THINK, started=started)
    out = []
    for p in pieces:
        out += s.feed(p)
    return out + s.flush()


@pytest.mark.parametrize("text,started,reasoning,answer", CASES)
def test_stream_cut_at_every_place_matches_whole(text, started, reasoning, answer):
    for cut in range(len(text) + 1):
        for cut2 in range(cut, len(text) + 1):
            parts = _stream([text[:cut], text[cut:cut2], text[cut2:]], started)
            got_r = "".join(t for k, t in parts if k == "reasoning")
            got_a = "".join(t for k, t in parts if k == "content")
            assert (got_r, got_a) == (reasoning or "", answer), (cut, cut2)


def test_stream_never_emits_a_partial_tag():
    text = "<think>first\n</think>\n\nsecond"
    parts = _stream(list(text), False)  # one character per delta
    for kind, piece in parts:
        assert "<" not in piece and ">" not in piece, parts
    assert [k for k, _ in parts if k == "reasoning"] and parts[-1][0] == "content"


def test_stream_emits_reasoning_before_the_close_arrives():
    s = ReasoningStream(THINK, started=True)
    assert s.feed("step one, ") == [("reasoning", "step one,")]  # the trailing blank waits
    assert s.feed("step two") == [("reasoning", " step two")]
    assert s.feed("</thi") == []
    assert s.feed("nk>\n\nok") == [("content", "ok")]


def test_random_deltas_agree_with_the_whole_reply():
    rng = random.Random(0)
    alphabet = ["<think>", "</think>", "<", "/", "t", "h", "i", "n", "k", ">", " ", "\n", "x", "yz"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        started = rng.random() < 0.5
        cuts = sorted(rng.sample(range(len(text) + 1), min(3, len(text) + 1)))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        parts = _stream(pieces, started)
        r, a = split_reasoning(text, THINK, started=started)
        assert "".join(t for k, t in parts if k == "reasoning") == (r or "")
        assert "".join(t for k, t in parts if k == "content") == a


def test_detection_from_template_or_vocab():
    assert detect_reasoning("{{ '<think>\\n' }}...{{ '</think>' }}") == THINK
    found = detect_reasoning("{{ messages }}", {"</think>": 7, "<think>": 6})
    assert (found.open, found.close, found.open_id, found.close_id) == ("<think>", "</think>", 6, 7)
    assert detect_reasoning("{{ messages }}", {"hello": 1}) is None
    assert detect_reasoning(None) is None


def test_prompt_tail_decides_whether_output_starts_in_thinking():
    assert opens_reasoning("<|User|>hi<|Assistant|><think>\n", THINK)
    assert not opens_reasoning("<|im_start|>assistant\n", THINK)
    assert not opens_reasoning("user says <think> here<|im_start|>assistant\n", THINK)
    assert not opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)  # thinking off
    assert not opens_reasoning("x<think>\n", None)


def test_template_kwargs_only_what_the_template_reads():
    tpl = "{% if enable_thinking is defined and not enable_thinking %}{% endif %}"
    assert template_kwargs(tpl, False, "high") == {"enable_thinking": False}
    assert template_kwargs("{{ reasoning_effort }}", True, "low") == {"reasoning_effort": "low"}
    assert template_kwargs("plain", None, None, {"custom": 1}) == {"custom": 1}


@pytest.fixture(scope="module")
def lltok(model_dir):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    llguidance = pytest.importorskip("llguidance")
    import llguidance.hf

    tok = load_tokenizer(model_dir("llama"))
    return tok, llguidance.hf.from_tokenizer(tok._tokenizer)


def _accepts(lltok, grammar: Grammar, text: str) -> bool:
    import llguidance

    tok, ll = lltok
    m = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar.source), log_level=0)
    assert not m.is_error(), m.get_error()
    ids = tok.encode(text)
    return m.consume_tokens(ids) and not m.is_error() and m.is_accepting()


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_grammar_binds_after_the_close_tag_started(lltok):
    g = answer_grammar(Grammar.json_schema(SCHEMA), THINK, started=True)
    assert _accepts(lltok, g, 'free { text " here\n</think>\n\n{"n":3}')
    assert not _accepts(lltok, g, 'free text</think>not json')
    assert not _accepts(lltok, g, '{"n":3}')  # the thinking must be closed first


def test_grammar_thinking_optional_when_not_started(lltok):
    g = answer_grammar(Grammar.json_object(), THINK, started=False)
    assert _accepts(lltok, g, '<think>hmm {"a":</think>{"a":1}')
    assert _accepts(lltok, g, '{"a":1}')
    assert not _accepts(lltok, g, 'hmm {"a":1}')


def test_grammar_wraps_a_lark_start_rule(lltok):
    g = answer_grammar(Grammar.lark('start: "yes" | "no"\n'), THINK, started=True)
    assert _accepts(lltok, g, "maybe</think>yes")
    assert not _accepts(lltok, g, "maybe</think>perhaps")
    with pytest.raises(ValueError):
        answer_grammar(Grammar.lark("top: \"a\"\n"), THINK, started=True)


def test_json_schema_answer_keeps_closed_objects():
    g = answer_grammar(Grammar.json_schema(SCHEMA), THINK, started=True)
    body = g.source.split("answer: %json ", 1)[1]
    assert json.loads(body)["additionalProperties"] is False
