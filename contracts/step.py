"""The step contract: what a lowered step (compiler/lower.py) takes and returns.

The runtime builds StepInputs for every batch and reads StepOutputs; the compiler's
lowering consumes the one and produces the other. Nothing is evaluated inside a step:
every array in StepOutputs is lazy, and the runtime decides when to `async_eval`.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import mlx.core as mx


@attrs.define
class StepInputs:
    """One batch, as the lowered step sees it."""

    tokens: mx.array  # int32 [B, L]; rows left-padded to a common length
    caches: list  # one LayerCache per layer
    final: bool = True  # prefill: the last chunk (run the head); decode: always True
    # The runtime's per-batch sampling state (runtime/batch_sampling.SamplingState: `st`
    # SamplingTensors, `positions`, `n_generated`, `counts`), handed to the sampling functions
    # of contracts/sampling.py; None: every row plain greedy.
    sampling: Any = None
    key: mx.array | None = None  # RNG key for rows without a seed
    extra_edits: mx.array | None = None  # additive [B, V] rows computed on the host (grammar masks)
    # x @ w.T for the head's dense weight, when a runtime brings its own (the compiled decode
    # path's skinny-matmul kernel, runtime/compiled_decode.py); None: the model's head as is.
    matmul: Callable | None = None
    prompt_targets: Any = None  # compiler.ops.PromptTargets when the (one) row asks for prompt logprobs
    pads: list | None = None  # left padding per row (pooling skips it); None: no padding
    options: dict | None = None  # per-batch request options ops read, e.g. {"dimensions": 256}
    # The chunk's logits at every position are wanted (prompt logprobs): the generic lowering
    # then runs the final chunk as one forward instead of splitting off its last token.
    all_positions: bool = False
    # The chunk position a final chunk samples from, when it is not the last: a padded chunk's last
    # real token (pads after it; causal attention keeps them from changing it). None: the last.
    sample_at: int | None = None


@attrs.define
class StepOutputs:
    """Every graph output under its own name (`values`), plus the ones the runtime reads most."""

    hidden: mx.array | None = None  # the attention node's value
    logits: mx.array | None = None  # [B, V]: the model's logits at the sampled position (model_logits_node)
    next_tokens: mx.array | None = None  # int32 [B]
    logprobs: Any = None  # a LogprobsOutput pack when some row asked
    values: dict = attrs.field(factory=dict)  # output name -> value (None when nothing asked for it)
