"""Where a chat prompt's messages end, as token offsets: the prefix cache keeps the state of
recurrent (SSM / linear-attention) and sliding layers at those offsets, because the next turn of
a growing chat shares this prompt up to a message end, not always up to its last token (a
template may render the generation prompt differently from the assistant message that later
replaces it, e.g. an empty `<think></think>` block, or drop an earlier turn's reasoning).

How: the prompt is rendered to text once and tokenized once with character offsets (what
apply_chat_template(tokenize=True) does inside: render, then tokenize without special tokens);
each of the last BOUNDARY_MESSAGES messages' prefix of the conversation is rendered to text
alone (a jinja render, no tokenization), and the character where it stops agreeing with the
whole prompt maps to the first token offset at or before it. Any offset is a correct place for
a snapshot (it only decides what can be reused); only the cost is bounded here."""

from __future__ import annotations

from bisect import bisect_right

# Messages at the end of the conversation whose ends are marked: a growing chat's new part is its
# last few messages (an agent turn: a call, its result, an answer); earlier ends were marked by
# the requests that had them last. Each costs one template render of the prefix (text only).
BOUNDARY_MESSAGES = 16


def render_with_boundaries(tok, messages: list[dict], flags: dict, extra: dict, *, encode=None,
                           boundaries: bool = True) -> tuple[list[int], tuple] | None:
    """(token ids, boundary offsets) for `messages`, or None where the tokenizer cannot give
    character offsets (a slow tokenizer): the caller tokenizes through apply_chat_template then.
    `encode`: a PrefixTokens (prefix_tokens.py) to tokenize with, reusing a recent prompt's tokens
    where this one extends it. `boundaries=False`: the ids only (no template renders of prefixes);
    None also where no `encode` could reuse anything, since apply_chat_template does the same then.
    Template errors propagate (they are the client's)."""
    hf = getattr(tok, "_tokenizer", tok)  # mlx-lm's TokenizerWrapper holds the Hugging Face tokenizer
    if not getattr(hf, "is_fast", False) or getattr(tok, "_chat_template", None) is not None:
        return None
    reuse = encode is not None and encode.enabled
    if not boundaries and not reuse:
        return None
    text = tok.apply_chat_template(messages, tokenize=False, **flags, **extra)
    if reuse:
        ids, ends = encode.encode(text, add_special_tokens=False)
    else:
        enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, ends = list(enc["input_ids"]), [e for _, e in enc["offset_mapping"]]
    if not boundaries:
        return ids, ()
    if any(b < a for a, b in zip(ends, ends[1:])):
        return ids, ()  # offsets out of order: no reliable mapping, no boundaries
    last = len(messages) - (1 if flags.get("continue_final_message") else 0)  # an open last message has no end
    bounds = set()
    for k in range(max(0, len(messages) - BOUNDARY_MESSAGES), last):
        try:
            head = tok.apply_chat_template(messages[:k + 1], tokenize=False, add_generation_prompt=False, **extra)
        except Exception:  # a template may refuse a prefix (e.g. one that must end with a user turn)
            continue
        t = bisect_right(ends, agreeing_chars(head, text))
        if 0 < t < len(ids):
            bounds.add(t)
    return ids, tuple(sorted(bounds))


def agreeing_chars(head: str, text: str) -> int:
    """Characters at the start of `head` equal to the start of `text` (binary search on slices: C speed)."""
    if text.startswith(head):
        return len(head)
    lo, hi = 0, min(len(head), len(text))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if head[:mid] == text[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
