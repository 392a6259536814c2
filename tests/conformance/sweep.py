"""Run one mlx-lm model type through graphc and through mlx-lm, and say how it ended.

Every type ends in exactly one outcome:

    exact     greedy tokens identical to mlx-lm's generate_step for every prompt (batched,
              chunked, past the sliding windows, then again with prefix-cache hits), and every
              step's full-vocabulary logprobs within the dtype's tolerance;
    refused   Engine.load raised ValueError / NotImplementedError (graphc's UnsupportedModel
              and GraphError are ValueErrors): the message is recorded;
    FAIL      anything else: wrong tokens or logprobs, an exception from a request after the
              model loaded, a request that finished with "error", or a crash inside load that
              is not a refusal (AttributeError, KeyError, ...);
    excluded  not run here (tiny_configs.EXCLUDED says why).

Reference: mlx-lm's own model (loaded from the same folder by ``mlx_lm.load``) with its own
caches (``make_prompt_cache``), one prompt at a time, greedy, through ``generate_step``.
graphc: ``Engine.load(folder, prefill_chunk=CHUNK)`` and ``engine.generate`` with all
prompts of a round batched together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from tiny_configs import EXCLUDED, VOCAB, WINDOW

CHUNK = 16  # prefill chunk: the 21- and 40-token prompts are prefilled in pieces
# Round 1 (cold): 4 prompts batched; 3 and 9 are short enough to share one padded prefill
# forward, 21 and 40 run past the chunk and past every sliding window / attention chunk (WINDOW).
LENGTHS = (3, 21, 40, 9)
MAX_TOKENS = 10
# Greedy output compared step by step; logprobs compared over the whole vocabulary. float32
# tiny models: graphc runs the same modules, so differences come from batching (left padding,
# masked columns) and chunking changing reduction order -- ~1e-5 in practice.
TOLERANCE = {"float32": 2e-3, "float16": 5e-2, "bfloat16": 1e-1}

assert max(LENGTHS) > CHUNK and max(LENGTHS) > 2 * WINDOW


@dataclass
class Outcome:
    model_type: str
    status: str  # exact | refused | FAIL | excluded
    detail: str = ""  # refusal message, failure reason, or exclusion reason
    lowering: str | None = None  # fast | generic, when the engine says which it used
    max_logprob_diff: float | None = None
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache in round 2 (0: none
    # reused -- a FAIL when the engine has a prefix cache; models without one run with engine.prefix None)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def first_line(self) -> str:
        return self.detail.strip().splitlines()[0] if self.detail.strip() else ""

    def summary(self) -> str:
        bits = [self.status]
        if self.lowering:
            bits.append(self.lowering)
        if self.max_logprob_diff is not None:
            bits.append(f"max|dlogprob|={self.max_logprob_diff:.2e}")
        if self.cached_tokens is not None:
            bits.append(f"cached={self.cached_tokens}")
        text = " ".join(bits)
        return f"{text}: {self.first_line}" if self.detail else text


class Mismatch(Exception):
    """graphc's output differs from mlx-lm's beyond tolerance (for ``prompt``; ``got``: graphc's tokens)."""

    def __init__(self, message: str, prompt=None, got=None):
        super().__init__(message)
        self.prompt, self.got = prompt, got


def prompts_for(seed: int, lengths) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # ids 3.. : the tokenizer's special tokens (0..2) stay out of the prompts.
    return [rng.integers(3, VOCAB, n).tolist() for n in lengths]


def reference(model, prompt: list[int], max_tokens: int, prefill_step: int = 2048) -> tuple[list[int], list[np.ndarray]]:
    """mlx-lm's greedy tokens and each step's full logprob vector (float32 numpy). The prompt is
    prefilled whole (generate_step's default step of 2048), unless ``prefill_step`` says otherwise."""
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    toks, lps = [], []
    for tok, lp in generate_step(mx.array(prompt), model, max_tokens=max_tokens, prefill_step_size=prefill_step,
                                 prompt_cache=make_prompt_cache(model)):
        toks.append(int(tok))
        lps.append(np.array(lp.astype(mx.float32)).reshape(-1))
    return toks, lps


def lowering_of(engine) -> str | None:
    """Which lowering served the model, where the engine exposes it (binding.lowering), and
    "unbatched" when the binding says it is exact only one request at a time (binding.batched)."""
    binding = getattr(getattr(engine, "compiled", None), "binding", None)
    lowering = getattr(binding, "lowering", None)
    if lowering and getattr(binding, "batched", True) is False:
        lowering += ", unbatched"
    return lowering


def _graphc_logprobs(res, vocab: int) -> list[np.ndarray] | None:
    if not res.logprobs:
        return None
    out = []
    for step in res.logprobs:
        row = np.full(vocab, np.nan, dtype=np.float64)
        for tid, lp in step["requested"]:
            row[tid] = lp
        out.append(row)
    return out


def compare(tag: str, prompt, got_ids, got_lps, ref_ids, ref_lps, tol: float) -> float:
    """Tokens equal (up to a genuine near-tie in mlx-lm's own logits), logprobs within `tol`.
    Returns the largest |logprob difference| seen; raises Mismatch."""
    worst = 0.0
    for i, ref_tok in enumerate(ref_ids):
        if got_lps is not None and i < len(got_lps):
            finite = np.isfinite(ref_lps[i])
            diff = float(np.max(np.abs(got_lps[i][finite] - ref_lps[i][finite])))
            worst = max(worst, diff)
            if not diff <= tol:  # also catches NaN
                raise Mismatch(f"{tag} (prompt of {len(prompt)} tokens): step {i} logprobs differ by {diff:.3g} "
                               f"(tolerance {tol:g})", prompt, got_ids[:i])
        if i >= len(got_ids):
            raise Mismatch(f"{tag} (prompt of {len(prompt)} tokens): graphc stopped after {len(got_ids)} tokens, "
                           f"mlx-lm gave {len(ref_ids)}")
        if got_ids[i] != ref_tok:
            top2 = np.sort(ref_lps[i])[-2:]
            if top2[1] - top2[0] < tol:
                return worst  # mlx-lm itself has a near-tie here: the rest depends on rounding
            raise Mismatch(f"{tag} (prompt of {len(prompt)} tokens): tokens differ at step {i}: "
                           f"graphc {got_ids[:i + 1]} vs mlx-lm {ref_ids[:i + 1]}", prompt, got_ids[:i + 1])
    return worst


def run_model(model_type: str, folder, reference_folder=None) -> Outcome:
    """Load ``folder`` (a tiny ``model_type`` model) in graphc and mlx-lm; compare; classify.
    ``reference_folder`` (default: the same folder) is what mlx-lm loads -- the harness's own
    test points it at other weights to show that a wrong model is caught."""
    if model_type in EXCLUDED:
        return Outcome(model_type, "excluded", EXCLUDED[model_type])
    t0 = time.perf_counter()
    out = _run(model_type, folder, reference_folder or folder)
    out.seconds = time.perf_counter() - t0
    return out


def _run(model_type: str, folder, reference_folder) -> Outcome:
    import mlx_lm

    from graphc.runtime import Engine, SamplingParams

    try:
        engine = Engine.load(folder, prefill_chunk=CHUNK, max_total_tokens=4096)
    except (ValueError, NotImplementedError) as e:
        return Outcome(model_type, "refused", f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - a crash inside load is not a clear refusal
        return Outcome(model_type, "FAIL", f"Engine.load crashed (not a refusal): {type(e).__name__}: {e}")
    out = Outcome(model_type, "exact", lowering=lowering_of(engine))
    ref_model, _ = mlx_lm.load(str(reference_folder))
    wide = _window_sizes(ref_model)
    if wide and max(wide) > WINDOW:
        out.status = "FAIL"
        out.detail = (f"tiny model problem: mlx-lm's caches have windows {sorted(set(wide))}, wider than WINDOW "
                      f"({WINDOW}); the prompts would not run past them -- shrink the window in tiny_configs.py")
        return out
    dtype = str(next(iter(dict(_leaves(ref_model)).values())).dtype).replace("mlx.core.", "")
    tol = TOLERANCE.get(dtype, 2e-3)
    vocab = engine.vocab_size
    stage = "round 1 (cold, batched)"
    try:
        # Round 1: cold, batched, chunked; the plain greedy path (no logprobs requested).
        p1 = prompts_for(1, LENGTHS)
        r1 = engine.generate(p1, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        refs1 = [reference(ref_model, p, MAX_TOKENS) for p in p1]
        flat = [p for p, (rt, _) in zip(p1, refs1) if len(set(rt)) == 1]
        if flat:  # the test model, not graphc: a random model that echoes one token proves little
            raise Mismatch(f"tiny model problem: mlx-lm's greedy output repeats one token for the prompt of "
                           f"{len(flat[0])} tokens; give {model_type} an INIT_GAINS entry in tiny_configs.py")
        worst = 0.0
        for p, res, (rt, rl) in zip(p1, r1, refs1):
            _check_finished(res, stage)
            worst = max(worst, compare(stage, p, res.token_ids, None, rt, rl, tol))
        # Round 2 on the same engine: prefix hits (a multi-turn follow-up, an exact repeat, a
        # shared prefix) next to a new cold prompt; full-vocabulary logprobs on every step.
        stage = "round 2 (prefix hits, logprobs)"
        extra = prompts_for(2, (5, 27))
        p2 = [
            p1[1] + r1[1].token_ids + extra[0],  # continues a finished request
            list(p1[2]),  # the whole prompt was seen
            p1[2][:30] + extra[0],  # shares 30 tokens
            extra[1],  # cold
        ]
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprob_token_ids=tuple(range(vocab)))
        r2 = engine.generate(p2, params)
        for p, res in zip(p2, r2):
            _check_finished(res, stage)
            rt, rl = reference(ref_model, p, MAX_TOKENS)
            worst = max(worst, compare(stage, p, res.token_ids, _graphc_logprobs(res, vocab), rt, rl, tol))
        out.max_logprob_diff = worst
        out.cached_tokens = sum(r.cached_tokens for r in r2)
        if getattr(engine, "prefix", None) is not None and not out.cached_tokens:
            raise Mismatch(f"{stage}: the engine has a prefix cache but no prompt reused a cached token "
                           "(an exact repeat and a continued conversation were among them)")
    except Mismatch as e:
        out.status, out.detail = "FAIL", str(e) + _chunk_dependence(ref_model, e)
    except Exception as e:  # noqa: BLE001 - any exception after a successful load is a failure
        out.status, out.detail = "FAIL", f"{stage} raised after the model loaded: {type(e).__name__}: {e}"
    return out


def _chunk_dependence(ref_model, err: "Mismatch") -> str:
    """A diagnosis for a mismatch: does mlx-lm itself change its answer when the prompt is prefilled
    in CHUNK-token pieces (as graphc does)? Then the model's own code depends on the chunking
    (e.g. a sliding mask wider than its rotating cache), and graphc reproduced the chunked answer."""
    if err.prompt is None or len(err.prompt) <= CHUNK:
        return ""
    whole, _ = reference(ref_model, err.prompt, MAX_TOKENS)
    chunked, _ = reference(ref_model, err.prompt, MAX_TOKENS, prefill_step=CHUNK)
    if whole == chunked:
        return ""
    same = err.got is not None and chunked[:len(err.got)] == list(err.got)
    return (f" [mlx-lm's own output depends on the prefill chunk for this prompt: whole {whole} vs in "
            f"{CHUNK}-token chunks {chunked}" + ("; graphc equals the chunked one" if same else "") + "]")


def _check_finished(res, stage: str) -> None:
    if res.finish_reason == "error":
        raise Mismatch(f"{stage}: request finished with error: {res.error}")


def _window_sizes(model) -> list[int]:
    """The bounded sizes of mlx-lm's own caches for ``model`` (rotating windows, attention chunks)."""
    from mlx_lm.models.cache import make_prompt_cache

    def walk(c):
        for sub in getattr(c, "caches", None) or [c]:
            if sub is c:
                yield c
            else:
                yield from walk(sub)

    sizes = []
    for c in make_prompt_cache(model):
        for leaf in walk(c):
            if type(leaf).__name__ == "RotatingKVCache":
                sizes.append(int(leaf.max_size))
            elif type(leaf).__name__ == "ChunkedKVCache":
                sizes.append(int(leaf.chunk_size))
    return sizes


def _leaves(model):
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())
