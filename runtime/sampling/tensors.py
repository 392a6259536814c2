"""Batched per-row sampling parameters, built once per batch composition.

``SamplingTensors.build`` turns a list of per-request params into ``[B]`` /
sparse ``mx.array``s plus host flags. The flags are what let the lowered step
skip work: the step functions branch on them in Python while the graph is
built, so an all-greedy batch lowers to a bare argmax, a batch without
penalties never touches a counts array, and so on.

Rows are split into *selection groups* by what their filters need:

  greedy      temperature 0 or top_k 1            -> argmax of the edited logits
  plain       temperature, maybe min_p            -> argmax(x/T + g) over the vocab
  candidates  top_k in 2..CANDIDATE_MAX           -> filters + Gumbel-max on a [b, K] set
  full        top_p without a top_k <= CANDIDATE_MAX,
              or top_k > CANDIDATE_MAX            -> full-vocabulary rank sort

Each group's parameters are sliced here on the host, so the step gathers
only logits rows (and only when a batch mixes groups).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import attrs
import mlx.core as mx
import numpy as np

from ..token_math.noise import split_seed
from .fused import FusedRows
from .kinds import CANDIDATES, FULL, GREEDY, PLAIN
from .params import SamplingParamsLike, check_token_ids, validate_params

CANDIDATE_MAX = 1024
# Batches of greedy and candidate rows select through one compiled function (fused.py);
# False keeps the grouped path for them (tests compare the two).
FUSED = True
_MIN_WIDTH = 16

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]



@attrs.frozen(eq=False)
class RowGroup:
    """Rows of a batch that share one selection path.

    rows        int32 [b] batch indices, or None when the group is the whole batch
    host_rows   the same indices as a tuple (for inspect / tests)
    width       rank-space width: the candidate count K, or V for 'full'/'plain'
    inv_temperature f32 [b]; top_k int32 [b] (clipped to width; width = off);
    top_p f32 [b] (1 = off); log_min_p f32 [b] (-inf = off)
    use_*       host flags: does any row of the group need that filter
    """

    kind: str
    rows: mx.array | None
    host_rows: tuple[int, ...]
    width: int
    inv_temperature: mx.array
    top_k: mx.array
    top_p: mx.array
    log_min_p: mx.array
    use_top_k: bool
    use_top_p: bool
    use_min_p: bool


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _row_kind(p: SamplingParamsLike, vocab_size: int) -> str:
    k = p.top_k if 0 < p.top_k < vocab_size else 0
    if p.temperature == 0.0 or k == 1:
        return GREEDY
    if k == 0 and p.top_p >= 1.0:
        # min_p alone is a value threshold against the row max: no sort needed.
        return PLAIN
    if 0 < k <= CANDIDATE_MAX:
        return CANDIDATES
    return FULL


def _eos_lists(eos_token_ids, batch_size: int) -> list[tuple[int, ...]]:
    """One flat list of ids for every row, or one list per row."""
    eos = list(eos_token_ids or ())
    if eos and not isinstance(eos[0], (int, np.integer)):
        if len(eos) != batch_size:
            raise ValueError(f"eos_token_ids has {len(eos)} rows for a batch of {batch_size}")
        return [tuple(int(i) for i in row) for row in eos]
    return [tuple(int(i) for i in eos)] * batch_size


@attrs.frozen(eq=False)
class SamplingTensors:
    """Per-row sampling state of one batch composition (see module doc).

    Arrays (B = batch_size, V = vocab_size):
      temperature            f32 [B]   0 for greedy rows
      logprob_inv_temperature f32 [B]  1/T, and 1 for greedy rows (logprobs use T=1 there)
      seed_lo, seed_hi       uint32 [B] the row's seed words (0 when unseeded)
      has_seed               bool [B]
      repetition_penalty, frequency_penalty, presence_penalty  f32 [B] (neutral when off)
      edit_rows/edit_cols/edit_vals  int32/int32/f32 [E]  static sparse additive edits
                             (logit_bias entries; banned ids carry -inf)
      eos_rows/eos_cols/eos_min_tokens int32 [M]  EOS entries of rows with min_tokens > 0
      logprob_token_ids      int32 [B, R] requested ids, right-padded with 0 (None if R = 0)
    Host flags say which of these a step needs at all.
    """

    batch_size: int
    vocab_size: int
    temperature: mx.array
    logprob_inv_temperature: mx.array
    seed_lo: mx.array
    seed_hi: mx.array
    has_seed: mx.array
    groups: tuple[RowGroup, ...]
    inverse_perm: mx.array | None
    fused: "FusedRows | None"  # whole-batch form when every row is greedy or candidates (fused.py)
    repetition_penalty: mx.array
    frequency_penalty: mx.array
    presence_penalty: mx.array
    edit_rows: mx.array | None
    edit_cols: mx.array | None
    edit_vals: mx.array | None
    eos_rows: mx.array | None
    eos_cols: mx.array | None
    eos_min_tokens: mx.array | None
    logprob_token_ids: mx.array | None
    # host-side
    all_greedy: bool
    any_seeded: bool
    all_seeded: bool
    has_penalties: bool
    has_repetition_penalty: bool
    has_additive_penalties: bool
    has_static_edits: bool
    has_min_tokens: bool
    want_logprobs: bool
    top_logprobs: int
    logprobs_n: tuple
    logprob_token_counts: tuple
    prompt_logprobs: tuple
    penalize_prompt: tuple
    logits_processors: tuple
    chain_safe: bool

    # ------------------------------------------------------------------ build

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParamsLike],
        vocab_size: int,
        *,
        eos_token_ids: Sequence[int] | Sequence[Sequence[int]] = (),
        logits_processors: Sequence[Sequence[LogitsProcessor] | None] | None = None,
        validate: bool = True,
        top_ranks_kernel: bool = False,
    ) -> "SamplingTensors":
        """Build from one params object per row.

        eos_token_ids: ids that ``min_tokens`` suppresses — one list for all rows
          or one list per row.
        logits_processors: per row, None or a list of host callables
          ``(token_ids_so_far: mx.array int32 [n], logits: mx.array [1, V]) -> [1, V]``.
          Any such row makes the batch not chain-safe.
        top_ranks_kernel: the fused selection's candidate stage may run as one CUDA kernel
          (runtime/kernels/top_ranks.py; the graph's `decode: {sampling_kernel: ...}`).
        """
        B, V = len(params), int(vocab_size)
        if B == 0:
            raise ValueError("cannot build sampling tensors for an empty batch")
        if validate:
            for p in params:
                validate_params(p)
                check_token_ids(p, V)

        temp = np.array([p.temperature for p in params], np.float32)
        inv_lp_t = np.where(temp > 0, 1.0 / np.where(temp > 0, temp, 1.0), 1.0).astype(np.float32)
        seeds = [split_seed(p.seed) if p.seed is not None else (0, 0) for p in params]
        has_seed = np.array([p.seed is not None for p in params])

        seed_lo = mx.array(np.array([s[0] for s in seeds], np.uint32))
        seed_hi = mx.array(np.array([s[1] for s in seeds], np.uint32))

        # --- selection groups
        kinds = [_row_kind(p, V) for p in params]
        groups = []
        order: list[int] = []
        for kind in (GREEDY, PLAIN, CANDIDATES, FULL):
            rows = [i for i, k in enumerate(kinds) if k == kind]
            if rows:
                groups.append(_make_group(kind, rows, params, V, inv_lp_t, whole=len(rows) == B))
                order += rows
        inverse_perm = None
        if len(groups) > 1:
            inv = np.empty(B, np.int32)
            inv[np.array(order)] = np.arange(B, dtype=np.int32)
            inverse_perm = mx.array(inv)

        # --- penalties (neutral values are exact identities, so rows without
        # penalties simply ride along with 1.0 / 0.0 / 0.0)
        rep = np.array([p.repetition_penalty for p in params], np.float32)
        freq = np.array([p.frequency_penalty for p in params], np.float32)
        pres = np.array([p.presence_penalty for p in params], np.float32)
        has_rep = bool(np.any(rep != 1.0))
        has_add = bool(np.any(freq != 0.0) or np.any(pres != 0.0))

        # --- static sparse edits: bias + bans merged per (row, col)
        edits: dict[tuple[int, int], float] = {}
        for i, p in enumerate(params):
            for t, b in (p.logit_bias or {}).items():
                edits[(i, int(t))] = edits.get((i, int(t)), 0.0) + float(b)
            for t in p.banned_token_ids:
                edits[(i, int(t))] = -math.inf
        e_rows = e_cols = e_vals = None
        if edits:
            keys = list(edits)
            e_rows = mx.array(np.array([k[0] for k in keys], np.int32))
            e_cols = mx.array(np.array([k[1] for k in keys], np.int32))
            e_vals = mx.array(np.array([edits[k] for k in keys], np.float32))

        # --- min_tokens: (row, eos id) entries, resolved lazily against n_generated
        eos_per_row = _eos_lists(eos_token_ids, B)
        m_rows, m_cols, m_min = [], [], []
        for i, p in enumerate(params):
            if p.min_tokens > 0:
                for t in eos_per_row[i]:
                    if not 0 <= t < V:
                        raise ValueError(f"eos token id {t} is out of range for a vocabulary of {V}")
                    m_rows.append(i), m_cols.append(t), m_min.append(p.min_tokens)
        has_min = bool(m_rows)

        # --- logprobs
        lp_n = tuple(p.logprobs for p in params)
        lp_ids = [tuple(p.logprob_token_ids) for p in params]
        R = max(len(x) for x in lp_ids)
        lp_ids_arr = None
        if R:
            a = np.zeros((B, R), np.int32)
            for i, ids in enumerate(lp_ids):
                a[i, : len(ids)] = ids
            lp_ids_arr = mx.array(a)
        want_lp = any(n is not None for n in lp_n) or R > 0

        procs = tuple(tuple(ps) if ps else None for ps in (logits_processors or [None] * B))
        if len(procs) != B:
            raise ValueError(f"logits_processors has {len(procs)} rows for a batch of {B}")

        return cls(
            batch_size=B,
            vocab_size=V,
            temperature=mx.array(temp),
            logprob_inv_temperature=mx.array(inv_lp_t),
            seed_lo=seed_lo,
            seed_hi=seed_hi,
            has_seed=mx.array(has_seed),
            groups=tuple(groups),
            inverse_perm=inverse_perm,
            fused=_fused_rows(kinds, groups, B, has_seed, seed_lo, seed_hi, V, top_ranks_kernel),
            repetition_penalty=mx.array(rep),
            frequency_penalty=mx.array(freq),
            presence_penalty=mx.array(pres),
            edit_rows=e_rows,
            edit_cols=e_cols,
            edit_vals=e_vals,
            eos_rows=mx.array(np.array(m_rows, np.int32)) if has_min else None,
            eos_cols=mx.array(np.array(m_cols, np.int32)) if has_min else None,
            eos_min_tokens=mx.array(np.array(m_min, np.int32)) if has_min else None,
            logprob_token_ids=lp_ids_arr,
            all_greedy=all(k == GREEDY for k in kinds),
            any_seeded=bool(has_seed.any()),
            all_seeded=bool(has_seed.all()),
            has_penalties=has_rep or has_add,
            has_repetition_penalty=has_rep,
            has_additive_penalties=has_add,
            has_static_edits=bool(edits),
            has_min_tokens=has_min,
            want_logprobs=want_lp,
            top_logprobs=max((n or 0) for n in lp_n),
            logprobs_n=lp_n,
            logprob_token_counts=tuple(len(x) for x in lp_ids),
            prompt_logprobs=tuple(p.prompt_logprobs for p in params),
            penalize_prompt=tuple(bool(p.penalize_prompt) for p in params),
            logits_processors=procs,
            chain_safe=all(p is None for p in procs),
        )

    # ------------------------------------------------------------------ views

    @property
    def needs_full_sort(self) -> bool:
        return any(g.kind == FULL for g in self.groups)

    @property
    def needs_edits(self) -> bool:
        return self.has_static_edits or self.has_min_tokens

    def describe(self) -> dict:
        """Plain-data summary for ``graphc inspect``."""
        return {
            "batch_size": self.batch_size,
            "vocab_size": self.vocab_size,
            "fused": {"width": self.fused.width, "seeding": self.fused.seeding, "kernel": self.fused.kernel,
                      "choose_kernel": self.fused.choose_kernel} if self.fused is not None else None,
            "groups": [
                {
                    "kind": g.kind,
                    "rows": list(g.host_rows),
                    "width": g.width,
                    "filters": [n for n, on in (("top_k", g.use_top_k), ("top_p", g.use_top_p), ("min_p", g.use_min_p)) if on],
                }
                for g in self.groups
            ],
            "penalties": self.has_penalties,
            "static_edits": self.has_static_edits,
            "min_tokens": self.has_min_tokens,
            "logprobs": {"top": self.top_logprobs, "token_ids": max(self.logprob_token_counts)} if self.want_logprobs else None,
            "chain_safe": self.chain_safe,
        }


def _fused_rows(kinds, groups, B: int, has_seed, seed_lo, seed_hi, V: int, kernel: bool):
    if not FUSED:
        return None
    return FusedRows.build(kinds, groups, B, has_seed, seed_lo, seed_hi, V, kernel)


def _make_group(kind: str, rows: list[int], params, V: int, inv_t: np.ndarray, whole: bool) -> RowGroup:
    ps = [params[i] for i in rows]
    ks = [p.top_k if 0 < p.top_k < V else 0 for p in ps]
    if kind == CANDIDATES:
        width = min(V, max(_MIN_WIDTH, _next_pow2(max(ks))))
    else:
        width = V
    top_k = np.array([k if k > 0 else width for k in ks], np.int32)
    top_p = np.array([p.top_p for p in ps], np.float32)
    min_p = np.array([p.min_p for p in ps], np.float64)
    with np.errstate(divide="ignore"):
        log_min_p = np.where(min_p > 0, np.log(np.where(min_p > 0, min_p, 1.0)), -np.inf).astype(np.float32)
    return RowGroup(
        kind=kind,
        rows=None if whole else mx.array(np.array(rows, np.int32)),
        host_rows=tuple(rows),
        width=width,
        inv_temperature=mx.array(inv_t[rows]),
        top_k=mx.array(top_k),
        top_p=mx.array(top_p),
        log_min_p=mx.array(log_min_p),
        use_top_k=bool(np.any(top_k < width)),
        use_top_p=bool(np.any(top_p < 1.0)),
        use_min_p=bool(np.any(min_p > 0)),
    )
