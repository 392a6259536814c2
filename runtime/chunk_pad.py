"""Padding a prompt's last prefill chunk to an aligned length (`pad_final_chunk`).

On CUDA, MLX's attention builds a cuDNN plan per exact (query length, key length, strides):
~40 ms the first time a shape is seen on an H200, ~5 ms after (docs/scheduling.md). The
scheduler ends every chunk that is not a prompt's end on a multiple of Scheduler.CHUNK_ALIGN,
but a prompt's last chunk has the prompt's own length, so without padding every request
built a plan of its own.

A final chunk runs as its tokens but the last (cache writes only), then the last token alone
(the logits it samples from): what the lowering does anyway (compiler/ops/forward.py,
`_last_only` / `_model_forward`). Padding makes the first part a multiple of the alignment:

- one request: pad tokens go AFTER its real tokens. The causal mask keeps every real position
  from seeing them, so the real K/V are those of the unpadded chunk; the cache is then trimmed
  back to the real length (FullKV reads only columns [0, idx): the pad columns are never read
  and the last real token's write lands on the first of them). The prefix cache inserts the
  prompt's context_ids and reads positions by row length, so it stores real tokens only.
- a batched prefill (whole prompts, rows left-padded): more left padding, which the mask
  already hides, so the query and the key length are both aligned; the columns every row pads
  are dropped before the rows join the decode batch.

Exact only where padding is the same as a chunk that is thrown away: every layer keeps plain
FullKV rows (full / pool_backed / quantized). Sliding windows (a rotating buffer would evict
real positions for pad ones) and recurrent / SSM state (the pads would advance it) keep the
unpadded chunk, as do prompt-logprobs chunks (they read every position's logits).
"""

from __future__ import annotations

from graphc.compiler.selfcheck import batch_prefill_ok

from . import kernels

SETTINGS = ("auto", True, False)
PAD_TOKEN = 0  # any id the embedding has: its positions feed nothing that is kept


def resolve(setting) -> bool:
    """"auto": on where MLX's CUDA backend runs (on the CPU padding is only extra work)."""
    if isinstance(setting, str) and setting == "auto":
        return kernels.available()
    return bool(setting)


def unpaddable(policies, prefix_io) -> str | None:
    """Why the graph's final chunks cannot be padded exactly (None: they can)."""
    if not batch_prefill_ok(policies):
        return "a layer keeps state other than plain FullKV rows (sliding window or recurrent state)"
    if prefix_io is not None and prefix_io.prefix.needs_boundaries:
        return "the prefix cache captures windowed / recurrent state at boundaries"
    return None


def pad_for(n: int, align: int) -> int:
    """Pad tokens that bring the n - 1 tokens before a final chunk's last one to a multiple of
    `align` (0: nothing to pad, or padding off with align 0)."""
    if align <= 0 or n < 2:
        return 0
    return -(n - 1) % align


def trim(caches: list, n: int) -> None:
    """Drop the last n written positions of every row (the pad columns): idx moves back, no copy."""
    for c in caches:
        c.trim_rows([n] * c.batch)
