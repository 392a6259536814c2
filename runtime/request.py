"""Requests as the scheduler sees them: plain Python state, no arrays but the cache handles.

One writer per field. Every mutable field of `Request` is written by exactly one module (its
owner); every other module reads it, or asks the owner through a method. `FIELD_OWNERS`
below is the table, and tests/test_request_ownership.py checks the source against it (an
assignment, augmented assignment or in-place call such as `.append` on `req.<field>` outside
the owner fails the test). docs/architecture.md has the same table with the "why".

    owner                   fields                                      others go through
    request.py (creation)   id, prompt_ids, params, arrival             nobody writes them later
    engine.py               detokenizer, grammar, noise_seed            Engine.fail(req, why) (engine_faults.py);
                            (add_request, before queueing);             HostEdits.take_failure (a logits
                            output_ids, logprobs, error,                processor failure is recorded
                            first_token_time, emitted_tokens,           there, not on the request)
                            emitted_logprobs (postprocess, _delta)
    scheduler.py            status, finish_reason, finish_time,         Scheduler.advance / started /
                            prefilled, cached_tokens, n_resumed,        preempt / reset / finish (the
                            preemptions, scheduled_time                 prefix cache's admit returns the
                                                                        hit length; the scheduler records it)
    runner.py               caches, pending_logprobs, prompt_logprobs   ModelRunner.leave / forget / reset
"""

from __future__ import annotations

import enum
import itertools
import time

import attrs

from .params import SamplingParams

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"  # admitted to the queue, no KV yet
    PREFILLING = "prefilling"  # some prompt chunks done
    RUNNING = "running"  # in the decode batch
    FINISHED = "finished"


@attrs.define(eq=False)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    id: str = attrs.field(factory=lambda: f"req-{next(_ids)}")
    output_ids: list[int] = attrs.field(factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    prefilled: int = 0  # context tokens whose KV exists
    n_resumed: int = 0  # output tokens folded back into the context after a preemption
    preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens that came from the prefix cache
    caches: list | None = None  # per-layer caches while prefilling (batch of one)
    arrival: float = attrs.field(factory=time.perf_counter)
    first_token_time: float | None = None
    scheduled_time: float | None = None  # the first step that ran a chunk of its prompt (queue time ends)
    finish_time: float | None = None
    emitted_tokens: int = 0  # output tokens already reported through step()
    detokenizer: object = None
    grammar: object = None  # GrammarState when the request has structured output
    error: str | None = None  # why this request failed (finish_reason "error"); others go on
    logprobs: list = attrs.field(factory=list)  # one dict per output token when asked (see docs/sampling.md)
    pending_logprobs: dict | None = None  # the first token's, from the prefill step
    emitted_logprobs: int = 0
    prompt_logprobs: list | None = None
    # The seed a sampled row without its own seed draws its noise with (docs/sampling.md): drawn
    # from the Engine's generator at add_request, so an Engine seed fixes it; None outside an Engine.
    noise_seed: int | None = None

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def context_ids(self) -> list[int]:
        """The tokens to put in the cache before the next token is sampled: the prompt, plus, for a
        request preempted and recomputed, the output it had produced by then."""
        if not self.n_resumed:
            return self.prompt_ids
        return self.prompt_ids + self.output_ids[: self.n_resumed]

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


# The module that writes each field (see the module docstring). The test reads this table.
FIELD_OWNERS: dict[str, str] = {
    **dict.fromkeys(("id", "prompt_ids", "params", "arrival"), "request"),
    **dict.fromkeys(("detokenizer", "grammar", "noise_seed", "output_ids", "logprobs", "error", "first_token_time",
                     "emitted_tokens", "emitted_logprobs"), "engine"),
    **dict.fromkeys(("status", "finish_reason", "finish_time", "prefilled", "cached_tokens", "n_resumed",
                     "preemptions", "scheduled_time"), "scheduler"),
    **dict.fromkeys(("caches", "pending_logprobs", "prompt_logprobs"), "runner"),
}


@attrs.frozen
class GenerationResult:
    """The finished output of one prompt."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    cached_tokens: int = 0
    logprobs: list | None = None
    prompt_logprobs: list | None = None
    ttft_s: float | None = None
    queue_s: float | None = None  # arrival -> the first step that ran its prompt (part of ttft_s)
    latency_s: float | None = None
    error: str | None = None  # set when finish_reason is "error"

    @property
    def usage(self) -> dict:
        return {"prompt_tokens": len(self.prompt_ids), "completion_tokens": len(self.token_ids),
                "cached_tokens": self.cached_tokens}


@attrs.frozen
class RequestOutput:
    """What one `Engine.step()` produced for one request: the new tokens and text since last time."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None = None
    new_logprobs: list | None = None
