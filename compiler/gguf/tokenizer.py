"""The GGUF tokenizer metadata -> tokenizer.json + tokenizer_config.json (Hugging Face `tokenizers`).

GGUF stores a byte-level BPE ("gpt2" model) as its token strings and merge list, plus a
pre-tokenizer name (`tokenizer.ggml.pre`) that stands for the regex splitting text before
BPE. The regexes below are those the named tokenizers publish in their tokenizer.json.
SentencePiece vocabularies (`llama`) are built in compiler/gguf/spm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from .reader import GGUFError, GGUFHeader
from .spm import build_spm

_GPT4_STYLE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _GPT4_STYLE.replace(r"\p{N}{1,3}", r"\p{N}")

# tokenizer.ggml.pre -> (pre-tokenizer factory, BPE ignore_merges)
_PRE = {
    "default": (lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False),
    "gpt-2": (lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False),
    # SmolLM / StarCoder: every digit on its own, then GPT-2's split.
    "smollm": (lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
               False),
    "starcoder": (lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
                  False),
    "llama-bpe": (lambda: _split_then_bytes(_GPT4_STYLE), True),
    "qwen2": (lambda: _split_then_bytes(_QWEN2), False),
}

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values for special / added tokens


def _split_then_bytes(pattern: str):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def token_ids(header: GGUFHeader) -> dict:
    md = header.metadata
    ids = {k: md.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "eot", "eom", "unknown", "padding")}
    return {k: (int(v) if v is not None else None) for k, v in ids.items()}


def build_tokenizer(header: GGUFHeader, path) -> Tokenizer:
    md = header.metadata
    model = md.get("tokenizer.ggml.model")
    if model == "llama":
        return build_spm(header, path)
    if model != "gpt2":
        raise GGUFError(f"{path}: tokenizer model '{model}' is not supported by graphc's GGUF import "
                        "('gpt2', the byte-level BPE of Llama 3, Qwen and SmolLM, and 'llama', "
                        "SentencePiece BPE of Llama 2, Mistral and Gemma, are); "
                        "convert the Hugging Face model with `mlx_lm.convert` instead")
    tokens = md["tokenizer.ggml.tokens"]
    merges = md.get("tokenizer.ggml.merges", [])
    pre = md.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE:
        raise GGUFError(f"{path}: pre-tokenizer '{pre}' is not known to graphc's GGUF import "
                        f"(known: {', '.join(sorted(_PRE))}); its text splitting would be guessed, "
                        "so the import stops here")
    make_pre, ignore_merges = _PRE[pre]
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=ignore_merges))
    tok.pre_tokenizer = make_pre()
    tok.decoder = decoders.ByteLevel()
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    added = [AddedToken(tokens[i], special=(ty == CONTROL), normalized=False)
             for i, ty in enumerate(types) if ty in (CONTROL, USER_DEFINED)]
    if added:
        tok.add_tokens(added)
    ids = token_ids(header)
    if md.get("tokenizer.ggml.add_bos_token", False) and ids["bos"] is not None:
        bos = tokens[ids["bos"]]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, ids["bos"])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def write_tokenizer(header: GGUFHeader, path, out: Path, context_length: int | None) -> None:
    md = header.metadata
    tok = build_tokenizer(header, path)
    tok.save(str(out / "tokenizer.json"))
    tokens = md["tokenizer.ggml.tokens"]
    ids = token_ids(header)

    def name(key):
        i = ids[key]
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name("bos"),
        "eos_token": name("eos"),
        "unk_token": name("unknown"),
        "pad_token": name("padding"),
        # llama.cpp adds BOS by default for SentencePiece vocabularies, not for byte-level BPE
        "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", md.get("tokenizer.ggml.model") == "llama")),
        "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
    }
    if context_length:
        cfg["model_max_length"] = context_length
    template = md.get("tokenizer.chat_template")
    if template:
        cfg["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}, indent=2))
    specials = {k: v for k, v in (("bos_token", name("bos")), ("eos_token", name("eos")),
                                  ("unk_token", name("unknown")), ("pad_token", name("padding"))) if v}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))


def eos_ids(header: GGUFHeader) -> list[int]:
    """EOS plus end-of-turn / end-of-message ids: generation stops at any of them."""
    ids = token_ids(header)
    out = [ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None]
    # Gemma files name no end-of-turn id; llama.cpp finds <end_of_turn> by its text, as here.
    tokens = header.metadata.get("tokenizer.ggml.tokens") or []
    types = header.metadata.get("tokenizer.ggml.token_type") or []
    for i, t in enumerate(tokens):
        if t == "<end_of_turn>" and (not types or types[i] == CONTROL):
            out.append(i)
    return list(dict.fromkeys(out))
