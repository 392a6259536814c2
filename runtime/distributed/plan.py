"""The step plan: what rank 0 sends the other ranks before each Engine.step.

Every rank holds a whole Engine (scheduler, prefix cache, runner) over its shard of the model.
The scheduler and runner are deterministic: given the same requests added and aborted at the
same step boundaries, and the same sampled tokens, every rank schedules the same batches and
builds the same graphs. So a plan carries only what rank 0 alone knows — the requests that
arrived (token ids, sampling params, id) and the aborts since the last step — plus a checksum
of what rank 0's previous step produced; a follower whose own step produced something else
has diverged and ends the group rather than run mismatched collectives.

Wire format: an int32 header of HEADER_WORDS, then (when body_len > 0) a UTF-8 JSON body.
"""

from __future__ import annotations

import json

import attrs

from ..grammar import Grammar
from ..grammar.matcher import GrammarState
from ..params import SamplingParams
from .group import crc

MAGIC = 0x67726370  # "grcp"
HEADER_WORDS = 8
STEP, IDLE, SHUTDOWN = 1, 2, 3
KIND_NAMES = {STEP: "step", IDLE: "idle", SHUTDOWN: "shutdown"}
NO_STEP_YET = 0


@attrs.define
class Plan:
    kind: int
    seq: int  # messages sent so far (every kind): a follower that skipped one knows
    last_digest: int  # digest of rank 0's previous step (NO_STEP_YET before the first)
    events: list = attrs.field(factory=list)  # ["add", id, ids, params] / ["abort", id]

    def header(self, body_len: int) -> list[int]:
        return [MAGIC, self.kind, self.seq, self.last_digest, body_len, 0, 0, 0]

    def body(self) -> bytes:
        return json.dumps({"events": self.events}, separators=(",", ":")).encode() if self.events else b""

    @classmethod
    def parse(cls, header: list[int], body: bytes) -> "Plan":
        if header[0] != MAGIC or header[1] not in KIND_NAMES:
            raise ValueError(f"not a step plan (header {header[:5]}): the ranks are out of step")
        events = json.loads(body)["events"] if body else []
        return cls(header[1], header[2], header[3], events)


def step_digest(outs) -> int:
    """What a step produced, as one number: request ids, new tokens, finishes, in order."""
    rows = [[o.request_id, o.new_token_ids, o.finished, o.finish_reason] for o in outs]
    return crc(json.dumps(rows, separators=(",", ":")).encode()) or 1


def error_digest(e: BaseException) -> int:
    """A step that raised: the same exception type on every rank is still agreement."""
    return crc(f"error:{type(e).__name__}".encode()) or 1


# -- sampling params on the wire ---------------------------------------------------------
def encode_params(p: SamplingParams) -> dict:
    """SamplingParams as JSON-safe data. Python logits processors cannot cross processes."""
    if p.logits_processors:
        raise ValueError("logits_processors (Python callables) are not supported on a distributed engine: "
                         "every rank must apply the same edits; use logit_bias / banned_token_ids / grammar")
    d = attrs.asdict(p, recurse=False)
    d.pop("logits_processors")
    d["grammar"] = _grammar_spec(p.grammar)
    d["logit_bias"] = {str(k): v for k, v in p.logit_bias.items()} if p.logit_bias else None
    return d


def decode_params(d: dict) -> SamplingParams:
    d = dict(d)
    g = d.pop("grammar")
    if g is not None:
        g = Grammar(g["kind"], g["source"])
    return SamplingParams(**d, grammar=g)


def _grammar_spec(g) -> dict | None:
    if g is None:
        return None
    if isinstance(g, GrammarState):
        spec = getattr(g, "spec", None)  # set by the leader engine's grammar compiler
        if spec is None:
            raise ValueError("a grammar compiled by another engine cannot be sent to the other ranks; "
                             "pass the Grammar (or its dict form) in SamplingParams instead")
        g = spec
    g = Grammar.coerce(g)
    return {"kind": g.kind, "source": g.source}
