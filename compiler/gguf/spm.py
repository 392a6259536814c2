"""GGUF's SentencePiece vocabulary (`tokenizer.ggml.model == "llama"`) -> a `tokenizers` BPE.

A SentencePiece BPE file in GGUF is pieces, scores and token types, no merge list.
llama.cpp's tokenizer (llm_tokenizer_spm) starts from the characters and repeatedly joins
the adjacent pair whose joined piece is in the vocabulary with the highest score; text no
piece covers falls back to <0xXX> byte tokens. A BPE whose merges are every split of every
piece, ranked by the joined piece's score, does the same (Hugging Face's Llama converter
builds its merges this way). Spaces become ▁ and, unless the file says
`add_space_prefix = false`, one ▁ goes in front, as SentencePiece's dummy prefix.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from .reader import GGUFError, GGUFHeader

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Every (left, right) split of every normal piece, best joined score first."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED, UNUSED)}
    ranked = []
    for piece, i in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def build_spm(header: GGUFHeader, path) -> Tokenizer:
    md = header.metadata
    tokens = md["tokenizer.ggml.tokens"]
    scores = md.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise GGUFError(f"{path}: a SentencePiece ('llama') tokenizer needs tokenizer.ggml.scores, one per token")
    types = md.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    unk_id = md.get("tokenizer.ggml.unknown_token_id")
    if unk_id is None:
        unk_id = next((i for i, t in enumerate(types) if t == UNKNOWN), None)
    vocab = {t: i for i, t in enumerate(tokens)}
    has_bytes = any(t == BYTE for t in types)
    model = models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, types),
                       unk_token=tokens[unk_id] if unk_id is not None else None,
                       fuse_unk=True, byte_fallback=has_bytes)
    tok = Tokenizer(model)
    prefix = bool(md.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend(SPACE)] if prefix else []
    tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPACE)])
    dec = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    specials = [AddedToken(tokens[i], special=(ty == CONTROL), normalized=False)
                for i, ty in enumerate(types) if ty in (CONTROL, USER_DEFINED)]
    if specials:
        tok.add_tokens(specials)
    bos = md.get("tokenizer.ggml.bos_token_id")
    if md.get("tokenizer.ggml.add_bos_token", True) and bos is not None:
        name = tokens[int(bos)]
        tok.post_processor = processors.TemplateProcessing(single=f"{name} $A", pair=f"{name} $A {name} $B",
                                                           special_tokens=[(name, int(bos))])
    return tok
