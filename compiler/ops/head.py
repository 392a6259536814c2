"""The head ops: logit_edits, sample, logprobs, prompt_logprobs.

They run on the logits of the positions being sampled (`last_position`), on the final
chunk of a prompt and every decode step. Their params are honoured twice over: the
lowering builds only what they allow, and the runtime (runtime/plan_contract.py) rejects
a request that asks for more, with an error naming the graph param.
"""

from __future__ import annotations

import attrs
import mlx.core as mx

from graphc.contracts.sampling import kernels  # the runtime's sampling math, by contract

from .registry import (LOGITS, LOGPROBS, PROMPT_LOGPROBS, TOKENS, Param, is_model_dtype_key, last_position,
                       needs_all_positions, register_op)

EDIT_KINDS = ("penalties", "logit_bias", "banned_tokens", "min_tokens", "grammar", "processors")
HOST_EDITS = ("grammar", "processors")  # computed on the CPU between steps: they break the chain
MAX_TOP_N = 20


def _check_edits(value):
    bad = [e for e in value if e not in EDIT_KINDS]
    if bad:
        return f"names unknown edit(s) {', '.join(map(repr, bad))} (known: {', '.join(EDIT_KINDS)})"
    return None


def _describe_edits(node, binding, kind):
    edits = node.params["edits"]
    if not edits:
        return "no edits (the graph declares none)"
    off = [e for e in EDIT_KINDS if e not in edits]
    return "applies " + ", ".join(edits) + (f"; requests asking for {', '.join(off)} are rejected" if off else "")


@register_op("logit_edits", inputs=(LOGITS,), output=LOGITS, phase="head", on_request=True,
             describe=_describe_edits,
             params={"edits": Param((list, tuple), list(EDIT_KINDS), check=_check_edits,
                                    doc="the edit kinds this graph applies; a request asking for another is "
                                        "rejected")},
             doc="penalties, then additive rows (bias, bans, min_tokens), then host rows (grammar, processors)")
def logit_edits(ctx, node, logits):
    k = kernels()
    edits = node.params["edits"]
    x = last_position(logits)
    s = ctx.inputs.sampling
    if s is not None:
        # The runner builds SamplingTensors with only the declared kinds (runtime/plan_contract.py
        # strips the rest), so bias / bans / min_tokens present in `s.st` are declared ones.
        if "penalties" in edits:
            x = k.penalize(x, s.st, s.counts)
        x = k.apply_edits(x, s.st, n_generated=s.n_generated)
    host = ctx.inputs.extra_edits
    if host is not None and any(e in edits for e in HOST_EDITS):
        x = k.apply_additive_mask(x.astype(mx.float32), host)
    return x


def _describe_sample(node, binding, kind):
    if node.params["method"] == "greedy":
        return "argmax for every row (sampling params are rejected)"
    return (f"per-row greedy / temperature / top-k / top-p / min-p, Gumbel-max; "
            f"[B, K] candidate set for rows with top_k <= {kernels().CANDIDATE_MAX}")


@register_op("sample", inputs=(LOGITS,), output=TOKENS, phase="head", describe=_describe_sample,
             params={"method": Param(str, "auto", choices=("auto", "greedy"),
                                     doc="`greedy`: argmax for every row; requests with temperature > 0 are "
                                         "rejected")},
             doc="per-row temperature / top-k / top-p / min-p selection with Gumbel-max noise")
def sample(ctx, node, logits):
    x = last_position(logits)
    s = ctx.inputs.sampling
    if s is None or node.params["method"] == "greedy":
        return mx.argmax(_unedited_source(ctx, x), axis=-1).astype(mx.int32)
    if s.st.fused is not None:  # the fused selection reads bf16 / f16 logits exactly (their float32 bits)
        x = _unedited_source(ctx, x)
    return kernels().select_tokens(x, s.st, s.positions, ctx.inputs.key)


def _unedited_source(ctx, x):
    """`x` itself, or the logits in the model's dtype that `x` is the exact float32 cast of, when
    nothing edited them on the way (logit_edits passes its input through unchanged): the argmax
    of an exact upcast is the argmax of its source, and the fused selection ranks and scales the
    float32 value of each logit either way, so the cast is never computed."""
    for key, raw in ctx.values.items():
        if is_model_dtype_key(key) and ctx.values.get(key[0]) is x:
            return raw
    return x


def _top_n(v):
    return None if isinstance(v, int) and 0 <= v <= MAX_TOP_N else f"must be an integer in 0..{MAX_TOP_N}, got {v!r}"


def _describe_logprobs(node, binding, kind):
    return f"chosen-token logprob, top-N (N <= {node.params['max_top_n']}), requested ids"


@register_op("logprobs", inputs=(LOGITS, TOKENS), output=LOGPROBS, phase="head", on_request=True,
             describe=_describe_logprobs,
             params={"max_top_n": Param(int, MAX_TOP_N, check=_top_n,
                                        doc="largest top-N a request may ask for (more is rejected)")},
             doc="chosen-token logprob, top-N and requested ids, from the edited distribution")
def logprobs(ctx, node, logits, tokens):
    s = ctx.inputs.sampling
    if s is None or not s.st.want_logprobs:
        return None
    st = s.st
    top = min(st.top_logprobs, node.params["max_top_n"])
    return kernels().logprobs_of(last_position(logits), st.logprob_inv_temperature, tokens, top=top,
                       token_ids=st.logprob_token_ids)


@attrs.frozen(eq=False)
class PromptLogprobs:
    """Lazy prompt logprobs of one row: position i scores the prompt token at i + 1.

    chosen f32 [n]; top_ids int32 [n, N] and top_logprobs f32 [n, N] (None when N = 0)."""

    chosen: mx.array
    top_ids: mx.array | None = None
    top_logprobs: mx.array | None = None

    def arrays(self) -> list:
        return [a for a in (self.chosen, self.top_ids, self.top_logprobs) if a is not None]

    def to_lists(self, targets: list[int]) -> list[dict]:
        lp = self.chosen.tolist()
        ids = self.top_ids.tolist() if self.top_ids is not None else None
        top = self.top_logprobs.tolist() if self.top_logprobs is not None else None
        return [{"token": t, "logprob": lp[i], "top": list(zip(ids[i], top[i])) if ids is not None else []}
                for i, t in enumerate(targets)]


@attrs.define
class PromptTargets:
    """StepInputs.prompt_targets: what a chunk's prompt logprobs score (a batch of one row).

    ids: the prompt token after each position of the chunk (the chunk's last position scores
    the next chunk's first token; the prompt's last position scores nothing), top: the top-N."""

    ids: list
    top: int = 0


def _check_prompt_logprobs(node, spec):
    return needs_all_positions(node, spec, "prompt logprobs")


def _describe_prompt_logprobs(node, binding, kind):
    return f"logprob of each prompt token given the ones before it, top-N (N <= {node.params['max_top_n']})"


@register_op("prompt_logprobs", inputs=(LOGITS, TOKENS), output=PROMPT_LOGPROBS, phase="forward",
             kinds=("prefill",), on_request=True, check=_check_prompt_logprobs,
             describe=_describe_prompt_logprobs,
             params={"max_top_n": Param(int, MAX_TOP_N, check=_top_n,
                                        doc="largest top-N a request may ask for (more is rejected)")},
             doc="per prompt position: the logprob of the next prompt token (raw logits, T = 1)")
def prompt_logprobs(ctx, node, logits, tokens):
    t = ctx.inputs.prompt_targets
    if t is None or not t.ids:
        return None
    n = len(t.ids)
    rows = logits[0, :n].astype(mx.float32)  # raw logits, every position: [n, V]
    out = kernels().logprobs_of(rows, None, mx.array(t.ids, dtype=mx.int32), top=min(t.top, node.params["max_top_n"]))
    return PromptLogprobs(out.chosen, out.top_ids, out.top_logprobs)
