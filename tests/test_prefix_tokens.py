"""Prompt tokenization reusing a recent prompt's tokens (runtime/server/prefix_tokens.py): a prompt
that extends a kept one gets exactly the tokens (and offsets) of tokenizing its whole text."""

from __future__ import annotations

import random

import httpx
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from mlx_lm.tokenizer_utils import NewlineTokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from graphc.benchmarks.agent_replay import conversation
from graphc.runtime.server.prefix_tokens import PrefixTokens
from graphc.runtime.server.prompts import chat_prompt, completion_prompts
from graphc.runtime.server.protocol import ChatCompletionRequest
from server_harness import live_server, wait_until


@pytest.fixture(scope="module")
def hf(model_dir):
    return AutoTokenizer.from_pretrained(str(model_dir("llama")))


# Llama 3's pre-tokenizer regex (a Split before a regex-free ByteLevel): the other common byte-level layout.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module")
def llama3_style():
    """A small BPE trained here, cut as Llama 3's tokenizer cuts text."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    corpus = ["The quick brown fox's 12345 jumps.\n\tdef f(x):\n    return x  # ok\n" * 50, "naïve 日本語 3.14!!\r\n" * 50]
    t.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["<|begin_of_text|>", "<|eot_id|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=t)


def _whole(hf, text, specials=True):
    enc = hf(text, add_special_tokens=specials, return_offsets_mapping=True)
    return list(enc["input_ids"]), [b for _, b in enc["offset_mapping"]]


def test_a_growing_conversation_reuses_tokens_and_gets_the_whole_texts_tokens(hf, model_dir):
    pt = PrefixTokens(hf)
    assert pt.enabled, pt.why_not
    turns, _ = conversation(str(model_dir("llama")), 16384, 8, 0)
    for specials in (True, False):
        for t in turns:
            assert pt.encode(t.prompt, specials) == _whole(hf, t.prompt, specials)
    assert pt.reuses >= 10 and pt.reused_tokens > 20000
    assert pt.verified == PrefixTokens.VERIFY and pt.enabled  # checked, and every check agreed


@pytest.mark.parametrize("parting", [False, True], ids=["extending", "parting"])
@pytest.mark.parametrize("which", ["make-model", "llama3-regex"])
def test_the_split_itself_is_exact_on_awkward_text(hf, llama3_style, which, parting, monkeypatch):
    """Unchecked (VERIFY 0): newlines before spaces, digits, punctuation, non-ASCII letters,
    special tokens and their text cut short, blank lines: each prompt, extending the last one or
    parting from it before its end, gives the whole text's tokens."""
    hf = hf if which == "make-model" else llama3_style
    monkeypatch.setattr(PrefixTokens, "VERIFY", 0)
    monkeypatch.setattr(PrefixTokens, "MIN_CHARS", 200)
    monkeypatch.setattr(PrefixTokens, "MIN_SHARED", 100)
    monkeypatch.setattr(PrefixTokens, "MARGIN", 8)  # the longest added token still sets the floor
    pt = PrefixTokens(hf)
    assert pt.margin > max(len(t) for t in hf.get_added_vocab())
    rng = random.Random(3)
    pieces = ["\n", "\n\n", " \n", "\n ", "  ", "x", "hello", " world", "12345", "3.14", "'s", "ünïcødé", "日本語",
              "<|endoftext|>", "<|im_start|>user\n", "<|im_end|>\n", "\n<|im_end|>", "\n<|eot_id|>", "\n\n\n", "\n   \n",
              "\n'", "\n-", "\t", "!!", "--", "\r\n", "naïve", " 7", "A"]
    text = ""
    for _ in range(160):
        if parting and len(text) > 50 and rng.random() < 0.4:
            text = text[:rng.randrange(len(text) // 2, len(text))]  # cut anywhere, special tokens included
        text += "".join(rng.choice(pieces) for _ in range(rng.randrange(5, 40)))
        assert pt.encode(text) == _whole(hf, text)
    assert pt.reuses > 50


def test_a_difference_turns_reuse_off_and_the_whole_texts_tokens_are_returned(hf, monkeypatch):
    monkeypatch.setattr(PrefixTokens, "MIN_CHARS", 100)
    monkeypatch.setattr(PrefixTokens, "MIN_SHARED", 100)

    class Broken(PrefixTokens):
        """A tail tokenized wrong (its last token dropped), as a tokenizer the split is not safe for would."""

        def _whole(self, text, specials):
            ids, starts, ends = super()._whole(text, specials)
            return (ids[:-1], starts[:-1], ends[:-1]) if not specials else (ids, starts, ends)

    pt = Broken(hf)
    base = "a line of words\n" * 20
    pt.encode(base)
    longer = base + "more words here\n" * 5
    assert pt.encode(longer) == _whole(hf, longer)
    assert not pt.enabled and "differed" in pt.why_not and pt.reuses == 0
    assert pt.encode(longer + "x" * 10) == _whole(hf, longer + "x" * 10)  # whole from now on


def test_tokenizers_that_are_not_a_byte_level_regex_are_tokenized_whole():
    def fast(pre, norm=None):
        t = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
        t.pre_tokenizer = pre
        if norm is not None:
            t.normalizer = norm
        return PreTrainedTokenizerFast(tokenizer_object=t)

    assert not PrefixTokens(fast(pre_tokenizers.Metaspace())).enabled
    assert not PrefixTokens(fast(pre_tokenizers.ByteLevel(add_prefix_space=True))).enabled
    assert not PrefixTokens(fast(pre_tokenizers.ByteLevel(add_prefix_space=False), normalizers.NFKC())).enabled
    assert PrefixTokens(fast(pre_tokenizers.ByteLevel(add_prefix_space=False))).enabled
    tok = fast(pre_tokenizers.Metaspace())
    pt = PrefixTokens(tok)
    for text in ("a a\n" * 2000, "a a\n" * 2100):
        assert pt.encode(text) == _whole(tok, text)
    assert pt.reuses == 0 and not pt.entries


def test_the_server_reuses_a_conversations_tokens_for_completions_and_chat(model_dir):
    """Through the door: a completions prompt and a chat that grow turn by turn get the ids the
    tokenizer (and apply_chat_template) give their whole text."""
    turns, _ = conversation(str(model_dir("llama")), 3072, 4, 1)  # the tiny model: 4,096 positions
    with live_server(model_dir("llama")) as srv:
        assert wait_until(lambda: httpx.get(srv.url + "/health").status_code == 200, timeout=60)
        state = srv.app.state.graphc
        tok = state.tokenizer
        for t in turns:
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": t.prompt, "max_tokens": 1}, timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(t.prompt))
            # the ids themselves, against mlx-lm's tokenizer wrapper's encode (what the server called before)
            assert completion_prompts(state, t.prompt)[0] == [list(tok.encode(t.prompt))]
        messages = []
        for t in turns:
            messages.append({"role": "user", "content": t.prompt[-3000:]})
            req = ChatCompletionRequest(model="tiny", messages=list(messages))
            want = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            assert chat_prompt(state, req) == list(want)
            messages.append({"role": "assistant", "content": "ok"})
        assert state.prompt_tokens.reuses >= 3 and state.prompt_tokens.enabled


def test_a_prompt_that_parts_from_a_kept_one_before_its_end_reuses_the_shared_start(hf, monkeypatch):
    """A chat template that renders the end differently once the conversation goes on (a generation
    prompt replaced by the assistant's message): the shared start is reused, the rest tokenized."""
    monkeypatch.setattr(PrefixTokens, "MIN_CHARS", 200)
    pt = PrefixTokens(hf)
    history = "".join(f"<|im_start|>user\nquestion {i} about things\n<|im_end|>\n" for i in range(80))
    first = history + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    second = history + "<|im_start|>assistant\nan answer\n<|im_end|>\n<|im_start|>user\nmore\n<|im_end|>\n"
    assert pt.encode(first) == _whole(hf, first)
    assert pt.encode(second) == _whole(hf, second)
    assert pt.reuses == 1 and pt.reused_tokens > 0.9 * len(_whole(hf, history)[0])
    unrelated = "x\n" * 2000
    assert pt.encode(unrelated) == _whole(hf, unrelated) and pt.reuses == 1  # nothing shared: whole


def test_a_tokenizer_class_with_its_own_text_methods_is_tokenized_through_them(model_dir):
    """mlx-lm's NewlineTokenizer rewrites newlines in `encode`: calling the tokenizer on the text
    would give other tokens, so reuse stays off and the server keeps calling `encode`."""
    path = str(model_dir("llama")) + "/tokenizer.json"
    nl = NewlineTokenizer(tokenizer_file=path)
    pt = PrefixTokens(nl)
    assert not pt.enabled and "NewlineTokenizer.encode" in pt.why_not

    class State:
        tokenizer, prompt_tokens, max_prompt_chars, vocab_size = nl, pt, 0, 1 << 20

        class config:
            max_prompts = 4

    text = "a line\n" * 1000
    assert completion_prompts(State, text)[0] == [nl.encode(text)] != [nl(text)["input_ids"]]
