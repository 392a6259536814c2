"""What the lowered Plan allows a request, read by the engine and the runner.

The graph declares which logit edits run (`logit_edits.edits`), how many top logprobs a
row may get (`logprobs.max_top_n`, `prompt_logprobs.max_top_n`) and whether logprobs are
computed at all (a graph without a logprobs node has none). The engine rejects a request
that asks for more (`request_problem`, an OpenAI-style 400 through the server); the runner
builds sampling tensors with only the declared edits (`restrict`), so even a request that
got past the check cannot make the step apply an edit the graph does not declare.
"""

from __future__ import annotations

import attrs

from graphc.compiler.ops import EDIT_KINDS

# The request fields behind each edit kind: how a request "asks" for it.
_FIELDS = {
    "penalties": "repetition_penalty / frequency_penalty / presence_penalty",
    "logit_bias": "logit_bias",
    "banned_tokens": "banned_token_ids",
    "min_tokens": "min_tokens",
    "grammar": "grammar (response_format)",
    "processors": "logits_processors",
}


def edits_asked(p) -> list[str]:
    """The edit kinds a request's params use, in EDIT_KINDS order."""
    used = {
        "penalties": p.repetition_penalty != 1.0 or bool(p.frequency_penalty) or bool(p.presence_penalty),
        "logit_bias": bool(p.logit_bias),
        "banned_tokens": bool(p.banned_token_ids),
        "min_tokens": p.min_tokens > 0,
        "grammar": p.grammar is not None,
        "processors": bool(p.logits_processors),
    }
    return [k for k in EDIT_KINDS if used[k]]


def request_problem(plan, p) -> str | None:
    """Why graph `plan.graph` cannot serve a request with params `p` as asked, or None."""
    g = plan.graph
    declared = plan.edits or ()
    for kind in edits_asked(p):
        if kind not in declared:
            have = f"declares edits: [{', '.join(declared)}]" if plan.edits is not None else "has no logit_edits node"
            return (f"{_FIELDS[kind]} is not supported by graph '{g}' (its logit_edits {have}); "
                    f"drop it or serve a graph whose logit_edits lists '{kind}'")
    wants_lp = p.logprobs is not None or bool(p.logprob_token_ids)
    if wants_lp and plan.logprobs_top_n is None:
        return f"logprobs are not computed by graph '{g}' (it has no logprobs node)"
    if p.logprobs is not None and plan.logprobs_top_n is not None and p.logprobs > plan.logprobs_top_n:
        return (f"logprobs={p.logprobs} asks for more top logprobs than graph '{g}' returns "
                f"(logprobs.max_top_n: {plan.logprobs_top_n}); ask for at most {plan.logprobs_top_n}")
    if p.prompt_logprobs is not None:
        n = plan.prompt_logprobs_top_n
        if n is None:
            return (f"prompt_logprobs are not computed by graph '{g}' (it has no prompt_logprobs node: "
                    "add a logits node with `positions: all` and a prompt_logprobs node, see docs/graph-format.md)")
        if p.prompt_logprobs > n:
            return (f"prompt_logprobs={p.prompt_logprobs} asks for more top logprobs than graph '{g}' returns "
                    f"(prompt_logprobs.max_top_n: {n}); ask for at most {n}")
    return None


def restrict(p, edits: tuple | None):
    """`p` without the edits a graph does not declare (what the sampler tensors are built from)."""
    declared = edits or ()
    drop = {}
    if "penalties" not in declared:
        drop.update(repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)
    if "logit_bias" not in declared:
        drop["logit_bias"] = None
    if "banned_tokens" not in declared:
        drop["banned_token_ids"] = ()
    if "min_tokens" not in declared:
        drop["min_tokens"] = 0
    changed = {k: v for k, v in drop.items() if getattr(p, k) != v}
    return attrs.evolve(p, **changed) if changed else p
