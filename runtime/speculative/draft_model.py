"""Draft-model drafting: a small model with the target's tokenizer proposes k greedy tokens.

Each row keeps its own mlx-lm caches on the draft model and the list of tokens they hold.
When the row drafts again, the caches are trimmed back to the longest prefix still on the
row's sequence (the accepted drafts stay, the rejected ones go), the new tokens are fed, and
k greedy steps are built lazily on each other and evaluated once. Rows draft one after the
other (the draft model runs batch-of-one); the verification on the target is batched as for
prompt lookup. Whatever the draft model proposes, the target keeps only what it agrees with,
so output is unchanged; a poor draft model only costs time.
"""

from __future__ import annotations

import weakref

import attrs
import mlx.core as mx
import mlx_lm
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from graphc.compiler.gguf import resolve_model_path

from ..cpu_weights import convert as convert_weights

PREFILL_CHUNK = 512  # draft-model prompt tokens per forward when a row first drafts


@attrs.define
class _DraftRow:
    cache: list
    tokens: list = attrs.field(factory=list)  # the tokens whose KV `cache` holds, in order


class DraftModel:
    def __init__(self, model, tokenizer=None, *, target_tokenizer=None, target_vocab: int | None = None,
                 path: str = "draft model"):
        self.model, self.path = model, path
        if not can_trim_prompt_cache(make_prompt_cache(model)):
            raise ValueError(f"draft model '{path}': its caches cannot be trimmed (sliding-window or recurrent "
                             "layers), so rejected drafts could not be removed; use a full-attention draft model")
        _check_tokenizers(tokenizer, target_tokenizer, target_vocab, path)
        self._rows: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @classmethod
    def load(cls, path, target_tokenizer=None, target_vocab: int | None = None) -> "DraftModel":
        """A model folder or .gguf file, loaded through mlx_lm.load like the target; on the CPU a
        quantized or half-precision draft runs in float32 (runtime/cpu_weights.py `auto`): its
        numbers only change which drafts the target accepts, never the output."""
        folder = resolve_model_path(path)
        if not (folder / "config.json").exists():
            raise FileNotFoundError(f"no draft model folder at '{path}' (expected a config.json there)")
        model, tokenizer = mlx_lm.load(str(folder))
        convert_weights(model, "auto")
        return cls(model, tokenizer, target_tokenizer=target_tokenizer, target_vocab=target_vocab, path=str(path))

    def __call__(self, req, k: int) -> list[int]:
        seq = req.prompt_ids + req.output_ids
        row = self._rows.get(req)
        if row is None:
            row = self._rows[req] = _DraftRow(make_prompt_cache(self.model))
        n = 0
        limit = min(len(row.tokens), len(seq) - 1)  # always feed at least the newest token
        while n < limit and row.tokens[n] == seq[n]:
            n += 1
        if n < len(row.tokens):
            trim_prompt_cache(row.cache, len(row.tokens) - n)
        feed = seq[n:]
        for i in range(0, len(feed) - 1, PREFILL_CHUNK):  # a long first feed in chunks, all but the last token
            part = feed[i:min(i + PREFILL_CHUNK, len(feed) - 1)]
            self.model(mx.array(part, dtype=mx.int32)[None], cache=row.cache)
            mx.eval([c.state for c in row.cache])
        x = mx.array(feed[-1:], dtype=mx.int32)[None]
        drafts = []
        for i in range(k):  # built lazily on each other, evaluated once
            y = mx.argmax(self.model(x, cache=row.cache)[:, -1, :], axis=-1).astype(mx.int32)
            drafts.append(y)
            if i + 1 < k:
                x = y[None]
        out = mx.concatenate(drafts).tolist()
        # The last draft was never fed: the caches hold the sequence and the first k - 1 drafts.
        row.tokens = seq + out[:-1]
        return out


def _check_tokenizers(draft, target, target_vocab, path) -> None:
    """Draft token ids must mean the target's tokens: same vocabulary size and same encoding."""
    if draft is None or target is None:
        return
    dv, tv = len(draft.get_vocab()) if hasattr(draft, "get_vocab") else None, (
        len(target.get_vocab()) if hasattr(target, "get_vocab") else target_vocab)
    probe = "Speculative decoding: the draft model's token ids must be the target's. 12345 éü"
    if (dv is not None and tv is not None and dv != tv) or draft.encode(probe) != target.encode(probe):
        raise ValueError(f"draft model '{path}' does not share the target's tokenizer (vocabulary {dv} vs {tv} "
                         "tokens, or a different encoding); a draft model must use the same tokenizer")
