"""How a prompt's last prefill chunk runs: the prefill plan's "final chunk" and "final chunk
padding" choices (compiler/passes/prefill_choices.py), as the runner obeys them.

On CUDA, MLX's attention builds a cuDNN plan per exact (query length, key length, strides):
~40 ms the first time a shape is seen on an H200, ~5 ms after (docs/scheduling.md). The
scheduler ends every chunk that is not a prompt's end on a multiple of Scheduler.CHUNK_ALIGN,
but a prompt's last chunk has the prompt's own length, so without padding every request
built a plan of its own. Padding rounds it up:

- `whole` (one forward over the chunk, logits at one position): one request gets pad tokens
  AFTER its real tokens, the whole chunk (real + pads) a multiple of the alignment, sampled at
  its last real position (`StepInputs.sample_at`). Causal attention keeps every real position
  from seeing the pads, so the real K/V and the sampled logits are those of the unpadded chunk;
  the cache is then trimmed back to the real length (FullKV reads only columns [0, idx)).
- `split` (the chunk but its last token, then the last token alone): the first part gets the
  pads, is trimmed, and the last token's write lands on the first pad column.
- a batched prefill (whole prompts, rows left-padded): more left padding, which the mask already
  hides, so the query and the key length are both aligned; the last column is real in every row.
  The columns every row pads are dropped before the rows join the decode batch.

The prefix cache inserts the prompt's context_ids and reads positions by row length, so it
stores real tokens only. The compiler pads only where that is exact (plain FullKV rows) and the
runner never pads a prompt-logprobs chunk (it reads every position's logits).
"""

from __future__ import annotations

import attrs

PAD_TOKEN = 0  # any id the embedding has: its positions feed nothing that is kept


@attrs.frozen
class FinalChunk:
    """whole: one forward per final chunk (else L-1 positions, then the last); align: pad final
    chunks to a multiple of this (0: unpadded); off: why they are not padded (None when they are)."""

    whole: bool
    align: int
    off: str | None

    @classmethod
    def of(cls, plan, align: int) -> "FinalChunk":
        """What the prefill `plan` chose, padding to multiples of `align` where it pads."""
        mode, pad = plan.choice("final chunk"), plan.choice("final chunk padding")
        on = pad is not None and pad.choice == "on"
        off = None if on else (pad.why if pad is not None else "the plan records no final chunk padding")
        return cls(whole=mode is not None and mode.choice == "whole", align=align if on else 0, off=off)

    def pad(self, n: int) -> int:
        """Pad tokens for a final chunk of n tokens: whole brings the n tokens to a multiple of the
        alignment, split the n - 1 before the last one (0: one token, or padding off)."""
        return pad_for(n if self.whole else n - 1, self.align) if n >= 2 else 0


def pad_for(n: int, align: int) -> int:
    """Tokens that bring n to a multiple of `align` (0 when align is 0: padding off)."""
    return -n % align if align > 0 else 0


def trim(caches: list, n: int) -> None:
    """Drop the last n written positions of every row (the pad columns): idx moves back, no copy."""
    for c in caches:
        c.trim_rows([n] * c.batch)
