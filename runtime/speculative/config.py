"""The `speculative` setting: what a request (SamplingParams / the server's `speculative` field)
or an engine default (`Engine(speculative=...)`, `graphc serve --speculative`) asks for."""

from __future__ import annotations

import attrs
import mlx.core as mx

SPEC_METHODS = ("prompt_lookup", "draft_model")  # draft_model: needs Engine(draft_model=...)
OFF = "off"
MAX_DRAFT_TOKENS = 16  # a verify batch writes k + 1 positions; more than this wastes the step


def default_num_draft_tokens(method: str = "prompt_lookup") -> int:
    """k when a request or the engine names none.

    GPU, prompt lookup: 16. A verify forward over k + 1 positions at small batches costs about
    what one position does (launch- and host-bound; on the H200 a SmolLM2 verify's device time
    was 0.1-0.5 ms of a 5.5-10 ms step), and lookup drafts cost nothing, so the longest draft the
    verify budget allows is the cheapest way through a copied stretch: replaying the grounded
    bench's answers (benchmarks/probes/draft_policy.py) took 54 verify steps for 384 tokens at
    k = 16 against 63 at k = 8 (40 against 63 with k kept at 16 after a rejection, see
    Speculator.shrink_k). GPU, draft model: 8 — each draft token is a step of the draft model.
    CPU: 4 — the verify budget (speculator.default_max_tokens, 4 positions) caps k at 3 anyway."""
    if mx.default_device() != mx.gpu:
        return 4
    return MAX_DRAFT_TOKENS if method == "prompt_lookup" else 8


@attrs.frozen
class SpecConfig:
    """method: "prompt_lookup" or "draft_model"; num_draft_tokens: k, the most drafts a row verifies per step;
    max_ngram / min_ngram: the suffix n-gram sizes prompt lookup tries (longest first; unused by
    draft_model)."""

    method: str = "prompt_lookup"
    num_draft_tokens: int = attrs.field(
        default=attrs.Factory(lambda self: default_num_draft_tokens(self.method), takes_self=True))
    max_ngram: int = 4
    min_ngram: int = 2

    def __attrs_post_init__(self):
        if self.method not in SPEC_METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(SPEC_METHODS)} (or 'off'), "
                             f"got {self.method!r}")
        k = self.num_draft_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_DRAFT_TOKENS:
            raise ValueError(f"num_draft_tokens must be an integer in 1..{MAX_DRAFT_TOKENS}, got {k!r}")
        for name in ("max_ngram", "min_ngram"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 16:
                raise ValueError(f"{name} must be an integer in 1..16, got {v!r}")
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram ({self.min_ngram}) must not exceed max_ngram ({self.max_ngram})")


def parse_speculative(value, num_draft_tokens: int | None = None) -> SpecConfig | str | None:
    """None (use the default) | "off" | a SpecConfig, from a method name, a mapping
    ({"method": ..., "num_draft_tokens": ...}) or a SpecConfig. Raises ValueError naming the field."""
    if value is None:
        if num_draft_tokens is not None:
            raise ValueError("num_draft_tokens needs speculative set (e.g. speculative='prompt_lookup')")
        return None
    if isinstance(value, SpecConfig):
        return value if num_draft_tokens is None else attrs.evolve(value, num_draft_tokens=num_draft_tokens)
    if isinstance(value, str):
        if value == OFF:
            return OFF
        fields = {"method": value}
    elif isinstance(value, dict):
        fields = dict(value)
        unknown = sorted(set(fields) - {f.name for f in attrs.fields(SpecConfig)})
        if unknown:
            raise ValueError(f"speculative has unknown key(s) {', '.join(unknown)} "
                             "(known: method, num_draft_tokens, max_ngram, min_ngram)")
        if fields.get("method", "prompt_lookup") == OFF:
            return OFF
    else:
        raise ValueError(f"speculative must be 'off', one of {', '.join(SPEC_METHODS)}, or an object with "
                         f"a method, got {value!r}")
    if num_draft_tokens is not None:
        fields["num_draft_tokens"] = num_draft_tokens
    if isinstance(value, dict):  # the server's `speculative` object: name the request field first
        try:
            return SpecConfig(**fields)
        except (TypeError, ValueError) as e:
            raise ValueError(f"speculative object: {e}") from None
    return SpecConfig(**fields)
