"""A step's prefill chunks as forwards (Schedule.groups): whole prompts with nothing cached share
left-padded batched forwards, every other chunk runs alone.

Plain Python over (request, tokens) pairs: the scheduler decides (runtime/scheduler.py), the runner
runs each group as one forward (runtime/runner.py, runtime/batched_prefill.py).
"""

from __future__ import annotations


def _padded_ok(lengths: list[int], chunk: int) -> bool:
    """A batched prefill pads every prompt to the longest: allow it while the padded batch is no
    bigger than one prefill chunk, or the padding stays under a third of the work."""
    padded = max(lengths) * len(lengths)
    return padded <= chunk or padded <= 1.5 * sum(lengths)


def _split_even(chunks: list, parts: int) -> list[list]:
    """`chunks` (sorted by length) cut into `parts` consecutive groups of about equal tokens."""
    total = sum(n for _, n in chunks)
    out, acc = [[]], 0
    for i, (req, n) in enumerate(chunks):
        left = len(chunks) - i  # chunks from this one on: every later group needs one
        if out[-1] and (acc >= total * len(out) / parts or left <= parts - len(out)):
            out.append([])
        out[-1].append((req, n))
        acc += n
    return out


def group_prefill(chunks: list, *, batch_prefill: bool, chunk: int, lanes: int = 1) -> list[list]:
    """Chunks that are whole prompts with nothing cached (and no prompt logprobs) go through
    batched forwards, shortest first so that each left-padded group pads little; every other
    chunk runs alone, first (in the step's order). A step's first tokens are all handed out
    when the step ends, so the order of its forwards costs nobody time to first token. With
    prefill lanes (runtime/batched_prefill.py) the whole prompts make at least `lanes` groups
    where there are as many, of about equal tokens, so that the lanes share the work."""
    def whole(req, n):
        return (batch_prefill and req.prefilled == 0 and n == len(req.context_ids)
                and req.params.prompt_logprobs is None)

    groups = [[(r, n)] for r, n in chunks if not whole(r, n)]
    batchable = sorted(((r, n) for r, n in chunks if whole(r, n)), key=lambda c: c[1])
    runs: list = []
    for req, n in batchable:
        if not runs or not _padded_ok([m for _, m in runs[-1]] + [n], chunk):
            runs.append([])
        runs[-1].append((req, n))
    if 1 <= len(runs) < lanes <= len(batchable):
        runs = _split_even(batchable, lanes)  # a group per lane, of about equal tokens
    return groups + runs


__all__ = ["group_prefill"]
