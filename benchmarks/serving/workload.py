"""Synthetic serving workload: prompts cut from a text corpus to token lengths drawn from the model's
own tokenizer, and fixed output lengths, seeded so both servers get the same list."""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer

# Enough text for prompts of thousands of tokens; the corpus ships with graphc for make-model.
_CORPUS_CHARS = 400_000


@dataclass(frozen=True)
class Request:
    prompt: str
    prompt_tokens: int  # tokens of `prompt` under the model's tokenizer (servers may add a BOS)
    max_tokens: int  # the target output length, sent as max_tokens with EOS disabled


def _lognormal_ints(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    """Lengths spread log-uniformly-ish: median at the geometric mean of [lo, hi], ±2 sigma at
    the ends, clipped. Real prompt lengths are skewed this way (many short, a few long)."""
    if lo >= hi:
        return [lo] * n
    mu = (math.log(lo) + math.log(hi)) / 2
    sigma = (math.log(hi) - math.log(lo)) / 4
    return [min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


CORPUS_PACKAGE = "graphc.compiler.modelgen"  # its corpus/*.txt, package data


def corpus_ids(tokenizer: Tokenizer) -> list[int]:
    root = resources.files(CORPUS_PACKAGE) / "corpus"
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(root.iterdir(), key=lambda p: p.name)
                     if p.name.endswith(".txt"))
    return tokenizer.encode(text[:_CORPUS_CHARS], add_special_tokens=False).ids


def make_workload(model_dir: str | Path, n: int, min_input: int, max_input: int,
                  min_output: int, max_output: int, seed: int = 0, variant: int = 0) -> list[Request]:
    """`n` requests with seeded lengths; `variant` > 0 keeps the lengths and cuts every prompt from
    another place in the corpus, so a server that saw variant 0 gets no prefix-cache hits from it."""
    if not 1 <= min_input <= max_input or not 1 <= min_output <= max_output:
        raise ValueError(f"need 1 <= min <= max for input ({min_input}, {max_input}) "
                         f"and output ({min_output}, {max_output}) lengths")
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    ids = corpus_ids(tok)
    while len(ids) < max_input * 2:  # a tiny corpus (or a huge prompt) wraps around
        ids = ids + ids
    rng = random.Random(seed)
    ins = _lognormal_ints(rng, n, min_input, max_input)
    outs = _lognormal_ints(rng, n, min_output, max_output)
    starts = rng if variant == 0 else random.Random(f"{seed}/{variant}")
    reqs = []
    for n_in, n_out in zip(ins, outs):
        start = starts.randrange(len(ids) - n_in)
        prompt = tok.decode(ids[start:start + n_in])
        # Decoding and re-encoding may merge a few tokens differently: count what the server will see.
        reqs.append(Request(prompt, len(tok.encode(prompt, add_special_tokens=False).ids), n_out))
    return reqs


def eos_token_ids(model_dir: str | Path) -> list[int]:
    """Every id that ends generation for this model: config.json's eos_token_id and the
    tokenizer's eos_token (mlx-lm stops on both)."""
    model_dir = Path(model_dir)
    out: set[int] = set()
    cfg = json.loads((model_dir / "config.json").read_text())
    eos = cfg.get("eos_token_id")
    out.update(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    tc = model_dir / "tokenizer_config.json"
    if tc.exists():
        name = json.loads(tc.read_text()).get("eos_token")
        name = name.get("content") if isinstance(name, dict) else name
        if name:
            tid = Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id(name)
            if tid is not None:
                out.add(tid)
    return sorted(out)


def ids_without_text(model_dir: str | Path) -> tuple[int, int]:
    """(ids of config.json's vocab_size the tokenizer has no token for, vocab_size). A random-weight
    model generates such ids; graphc streams no chunk for a token without text and mlx_lm.server
    renders it as "!", so the two servers' chunks, and so ITL and TTFT, would not compare."""
    model_dir = Path(model_dir)
    n = int(json.loads((model_dir / "config.json").read_text()).get("vocab_size") or 0)
    size = Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    return max(0, n - size), n


def summary(reqs: list[Request]) -> dict:
    ins = sorted(r.prompt_tokens for r in reqs)
    outs = sorted(r.max_tokens for r in reqs)
    return {"requests": len(reqs), "input_tokens": {"min": ins[0], "median": ins[len(ins) // 2], "max": ins[-1],
                                                    "total": sum(ins)},
            "output_tokens": {"min": outs[0], "median": outs[len(outs) // 2], "max": outs[-1], "total": sum(outs)}}


def as_dicts(reqs: list[Request]) -> list[dict]:
    return [{k: v for k, v in asdict(r).items() if k != "prompt"} for r in reqs]
