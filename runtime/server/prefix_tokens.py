"""Prompt tokenization that reuses a recent prompt's tokens when the new prompt shares its start.

An agent or a chat client sends the same conversation again and again, each time a little longer.
The prefix cache makes the model's side of such a turn cost its new tokens only, but the server
still tokenized the whole text: ~75 ms for a 32k-token prompt on a development CPU (the make_shape
BPE tokenizer; benchmarks/probes/prefix_tokens.py), a warm turn's whole prefill on an H100 at that
length. Here the last few long prompts' tokens are kept; a prompt that shares a long start with
one of them (its whole text, or all but an end a chat template renders differently once the
conversation goes on: a generation prompt, an earlier turn's reasoning) is tokenized from a safe
split point near where the two part, and the kept tokens before it are reused.

When a split is safe: byte-level BPE tokenizers (GPT-2, Llama 3, Qwen, SmolLM, ...) first cut the
text into pieces with a regex and never merge across pieces, and a piece boundary is decided by
the characters around it; added tokens (`<|im_end|>`, ...) are cut out before that, each decided
by the characters it spans. So the split is placed right after a newline that is followed by a
non-space character, at least MARGIN characters (and more than the longest added token) before
the two texts part, so nothing after the parting reaches back to it, where the kept
tokenization has a token starting. Tokenizers of
any other kind (SentencePiece's metaspace, a normalizer) are always tokenized whole.

Exactness is also checked, not only argued: the first VERIFY reuses of each tokenizer are compared
with a whole tokenization, and one difference turns reuse off for good (logged). Tokens are the
same as the whole text's; only the time differs.

Runs on the server's tokenization thread, one call at a time (ServerState.run_cpu).
"""

from __future__ import annotations

import collections
import json
import logging
from array import array
from bisect import bisect_left

from .message_bounds import agreeing_chars

log = logging.getLogger("graphc.server")


class PrefixTokens:
    MIN_CHARS = 4096  # shorter texts are tokenized whole: cheap, and not worth keeping
    MARGIN = 64  # characters between the split and where the kept text and this one part
    MIN_SHARED = 1024  # characters two prompts must share for the kept tokens to be worth reusing
    ENTRIES = 8  # recent long prompts kept (a few conversations at once)
    VERIFY = 4  # reuses checked against a whole tokenization before reuse is trusted

    def __init__(self, tokenizer):
        # mlx-lm's TokenizerWrapper holds the Hugging Face tokenizer (which holds its own Rust one)
        inner = getattr(tokenizer, "_tokenizer", None)
        self.hf = inner if hasattr(inner, "is_fast") else tokenizer
        self.enabled, self.why_not = _splittable(self.hf)
        # Added tokens (<|im_end|>, ...) are cut out before the regex runs, so whether one starts
        # after the split changes the pieces before it: the split stays farther back than the
        # longest of them reaches.
        self.margin = max(self.MARGIN, _longest_added(self.hf) + 2)
        self.entries: collections.OrderedDict = collections.OrderedDict()  # (text, specials) -> _Kept
        self.verified = 0
        self.reused_tokens = 0  # tokens taken from a kept prompt instead of tokenized again
        self.reuses = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> tuple[list[int], list[int]]:
        """(token ids, each token's end character offset) of `text`, as the tokenizer gives them for
        the whole text (`hf(text, return_offsets_mapping=True)`)."""
        if not self.enabled or len(text) < self.MIN_CHARS:
            ids, starts, ends = self._whole(text, add_special_tokens)
        else:
            got = self._reuse(text, add_special_tokens)
            ids, starts, ends = got if got is not None else self._whole(text, add_special_tokens)
            self._keep(text, add_special_tokens, ids, starts, ends)
        return list(ids), list(ends)

    def _whole(self, text: str, specials: bool):
        enc = self.hf(text, add_special_tokens=specials, return_offsets_mapping=True)
        offs = enc["offset_mapping"]
        return list(enc["input_ids"]), [a for a, _ in offs], [b for _, b in offs]

    def _reuse(self, text: str, specials: bool):
        # The kept prompt sharing the longest start with this one: its whole text for a plain
        # extension, or up to where a chat template rendered the end differently (a generation
        # prompt that the assistant's message replaces, an earlier turn's reasoning dropped).
        shared, kept = max(((agreeing_chars(k.text, text), k) for (_, s), k in self.entries.items() if s == specials),
                           key=lambda x: x[0], default=(0, None))
        if kept is None or shared < self.MIN_SHARED:
            return None
        split = _split_point(kept.text, shared - self.margin)
        k = bisect_left(kept.starts, split) if split > 0 else 0
        if k == 0 or k >= len(kept.ids) or kept.starts[k] != split:
            return None  # no token starts there (e.g. the newline is inside a special token)
        tail = self._whole(text[split:], False)
        ids = list(kept.ids[:k]) + tail[0]
        starts = list(kept.starts[:k]) + [split + a for a in tail[1]]
        ends = list(kept.ends[:k]) + [split + b for b in tail[2]]
        if self.verified < self.VERIFY:
            whole = self._whole(text, specials)
            if whole[0] != ids:
                self.enabled = False
                self.why_not = "a reused prompt's tokens differed from the whole text's"
                log.warning("prompt tokens: reusing a previous prompt's tokens gave different ids than tokenizing "
                            "the whole text; every prompt is tokenized whole from now on")
                return whole
            self.verified += 1
        self.reuses += 1
        self.reused_tokens += k
        return ids, starts, ends

    def _keep(self, text: str, specials: bool, ids, starts, ends) -> None:
        key = (text, specials)
        self.entries.pop(key, None)
        self.entries[key] = _Kept(text, array("i", ids), array("i", starts), array("i", ends))
        while len(self.entries) > self.ENTRIES:
            self.entries.popitem(last=False)


class _Kept:
    __slots__ = ("text", "ids", "starts", "ends")

    def __init__(self, text, ids, starts, ends):
        self.text, self.ids, self.starts, self.ends = text, ids, starts, ends


def _split_point(text: str, before: int) -> int:
    """The character after the last newline before `before` that a non-space character follows,
    or 0 (none)."""
    i = before
    while i > 0:
        nl = text.rfind("\n", 0, i)
        if nl < 0:
            return 0
        if nl + 1 < len(text) and not text[nl + 1].isspace():
            return nl + 1
        i = nl
    return 0


def _longest_added(hf) -> int:
    """Characters in the longest added token's text (0 where the tokenizer lists none)."""
    try:
        return max((len(t) for t in hf.get_added_vocab()), default=0)
    except Exception:  # noqa: BLE001 - no list of added tokens: assume a long one
        return 256


def _splittable(hf) -> tuple[bool, str | None]:
    """Whether `hf` is a fast tokenizer whose text is cut by a byte-level regex and nothing else
    (see the module docstring); (False, why) otherwise."""
    if not getattr(hf, "is_fast", False):
        return False, "not a fast tokenizer"
    custom = _custom_method(hf)
    if custom is not None:  # e.g. mlx-lm's NewlineTokenizer rewrites the text in `encode`
        return False, f"{custom} is the tokenizer's own: text may not reach the backend as given"
    try:
        spec = json.loads(hf.backend_tokenizer.to_str())
    except Exception as e:  # noqa: BLE001 - an unusual backend: tokenize whole
        return False, f"tokenizer not readable ({type(e).__name__})"
    if spec.get("normalizer") is not None:
        return False, "the tokenizer normalizes text"
    pre = spec.get("pre_tokenizer")
    kinds = _kinds(pre)
    if '"add_prefix_space": true' in json.dumps(pre):
        return False, "the pre-tokenizer adds a prefix space to every text it is given"
    if "ByteLevel" not in kinds or not kinds <= {"ByteLevel", "Split", "Sequence", "Digits"}:
        return False, f"pre-tokenizer {sorted(kinds) or 'none'} is not a byte-level regex"
    return True, None


# The methods between a text and the backend's tokens. Here they are called as Hugging Face defines
# them (the tokenizer called on the text); a class that redefines one (mlx-lm's NewlineTokenizer
# rewrites newlines in `encode`) would tokenize differently through `encode`, what the server
# called before, so such a tokenizer is always tokenized through its own methods.
_TEXT_METHODS = ("__call__", "encode", "encode_plus", "_encode_plus", "_batch_encode_plus", "tokenize", "_tokenize",
                 "prepare_for_tokenization")


def _custom_method(hf) -> str | None:
    """`Class.method` for the first text method `hf`'s class takes from outside transformers, or None."""
    for name in _TEXT_METHODS:
        owner = next((c for c in type(hf).__mro__ if name in vars(c)), None)
        if owner is not None and not owner.__module__.startswith("transformers."):
            return f"{owner.__name__}.{name}"
    return None


def _kinds(pre) -> set:
    if not pre:
        return set()
    out = {pre.get("type")}
    for p in pre.get("pretokenizers") or ():
        out |= _kinds(p)
    return out
