"""Logprobs of chosen, top-N and requested tokens, and of prompt tokens.

Which distribution (generated tokens): log_softmax in float32 of

    (logits after penalties, bias, bans, min_tokens and grammar edits) / T

with T = 1 for greedy rows (T = 0 has no distribution; the edits still apply).
It is taken *before* top-k / top-p / min-p filtering, so a token the filters
dropped still has its finite logprob, while a banned (-inf) token has -inf.

Prompt logprobs: log_softmax in float32 of the raw model logits (T = 1, no
penalties or edits) — they describe the prompt, not the sampler.

Only the log-normaliser ``lse [B]`` is reduced over the vocabulary; chosen /
requested logprobs are gathers, and top-N uses a top-k over rank keys, so no
``[B, V]`` logprob array is materialised.
"""

from __future__ import annotations

import functools

import attrs
import mlx.core as mx

from ..token_math.ranks import ids_from_keys, rank_keys


@attrs.frozen(eq=False)
class LogprobsOutput:
    """Lazy logprobs of one step (B rows).

    chosen        f32 [B]       logprob of the selected token
    top_ids       int32 [B, N]  N = max requested top-N over rows (None when N = 0);
                                ordered by logprob descending, ties by lower id
    top_logprobs  f32 [B, N]
    requested     f32 [B, R]    logprobs of SamplingTensors.logprob_token_ids (None when R = 0)
    """

    chosen: mx.array
    top_ids: mx.array | None = None
    top_logprobs: mx.array | None = None
    requested: mx.array | None = None

    def to_lists(self, st) -> list[dict | None]:
        """Host finalisation (after eval): per row, trimmed to what it asked for.
        Returns None for rows that asked for nothing, else
        {"logprob": float, "top": [(id, logprob), ...], "requested": [(id, logprob), ...]}."""
        chosen = self.chosen.tolist()
        top_ids = self.top_ids.tolist() if self.top_ids is not None else None
        top_lp = self.top_logprobs.tolist() if self.top_logprobs is not None else None
        req = self.requested.tolist() if self.requested is not None else None
        req_ids = st.logprob_token_ids.tolist() if st.logprob_token_ids is not None else None
        out = []
        for i in range(st.batch_size):
            n, r = st.logprobs_n[i], st.logprob_token_counts[i]
            if n is None and r == 0:
                out.append(None)
                continue
            n = n or 0
            out.append(
                {
                    "logprob": chosen[i],
                    "top": list(zip(top_ids[i][:n], top_lp[i][:n])) if n else [],
                    "requested": list(zip(req_ids[i][:r], req[i][:r])) if r else [],
                }
            )
        return out


def top_n(s: mx.array, lse: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """Top-n (ids int32 [b, n], logprobs f32 [b, n]) of scaled logits ``s`` [b, V]."""
    keys = mx.topk(rank_keys(s), n, axis=-1)
    keys = mx.sort(keys, axis=-1)[:, ::-1]
    ids = ids_from_keys(keys)
    return ids, mx.take_along_axis(s, ids, axis=-1) - lse


def logprobs_of(
    logits: mx.array,
    inv_temperature: mx.array | None,
    tokens: mx.array,
    *,
    top: int = 0,
    token_ids: mx.array | None = None,
) -> LogprobsOutput:
    """Logprobs of ``tokens`` int [B] under log_softmax(logits * inv_temperature).

    logits [B, V] any float dtype; inv_temperature f32 [B] or None (= 1);
    top: how many top entries; token_ids int32 [B, R] extra ids to report.
    """
    f = _compiled(top, inv_temperature is not None, token_ids is not None)
    chosen, top_ids, top_lp, req = f(logits, inv_temperature, tokens, token_ids)
    return LogprobsOutput(chosen=chosen, top_ids=top_ids, top_logprobs=top_lp, requested=req)


def _logprobs(logits, inv_temperature, tokens, token_ids, *, top):
    s = logits.astype(mx.float32)
    if inv_temperature is not None:
        s = s * inv_temperature[:, None]
    lse = mx.logsumexp(s, axis=-1, keepdims=True)
    chosen = (mx.take_along_axis(s, tokens.astype(mx.int32)[:, None], axis=-1) - lse)[:, 0]
    top_ids = top_lp = req = None
    if top > 0:
        top_ids, top_lp = top_n(s, lse, top)
    if token_ids is not None:
        req = mx.take_along_axis(s, token_ids.astype(mx.int32), axis=-1) - lse
    return chosen, top_ids, top_lp, req


@functools.lru_cache(maxsize=None)
def _compiled(top: int, has_inv_t: bool, has_ids: bool):
    # None inputs/outputs cannot cross mx.compile, so each combination gets a
    # wrapper with only array arguments and results.
    def f(*args):
        it = iter(args)
        logits, tokens = next(it), next(it)
        inv_t = next(it) if has_inv_t else None
        ids = next(it) if has_ids else None
        return tuple(o for o in _logprobs(logits, inv_t, tokens, ids, top=top) if o is not None)

    cf = mx.compile(f)

    def call(logits, inv_t, tokens, ids):
        args = [logits, tokens] + ([inv_t] if has_inv_t else []) + ([ids] if has_ids else [])
        outs = iter(cf(*args))
        chosen = next(outs)
        top_ids, top_lp = (next(outs), next(outs)) if top > 0 else (None, None)
        req = next(outs) if has_ids else None
        return chosen, top_ids, top_lp, req

    return call


def token_logprobs(logits: mx.array, st, tokens: mx.array) -> LogprobsOutput:
    """The batch's logprobs (``st``: SamplingTensors) for the chosen ``tokens`` [B].
    ``logits`` must be the edited logits that selection saw."""
    return logprobs_of(
        logits,
        st.logprob_inv_temperature,
        tokens,
        top=st.top_logprobs,
        token_ids=st.logprob_token_ids,
    )


def prompt_logprobs(
    logits: mx.array, next_ids: mx.array, top: int = 0
) -> tuple[mx.array, mx.array | None, mx.array | None]:
    """Prompt logprobs from raw logits [L, V]: position i scores ``next_ids[i]``
    (the token at position i + 1). Returns (f32 [L], ids int32 [L, top] | None,
    f32 [L, top] | None). The first prompt token has no logprob; for a prompt
    p of length L pass logits[:-1] and p[1:] (chunked prefill: each chunk's
    last row scores the next chunk's first token).
    """
    out = logprobs_of(logits, None, next_ids, top=top)
    return out.chosen, out.top_ids, out.top_logprobs
