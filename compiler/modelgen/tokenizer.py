"""Byte-level BPE tokenizer for generated models, trained on the shipped corpus.

Training takes a few seconds, so it never happens at import: the tokenizer
for the default vocab size is committed as package data
(``tokenizers/bpe-<vocab>.json``) and any other size is trained on first use
and cached under ``~/.cache/graphc/tokenizers/`` keyed by the corpus hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from tokenizers import decoders, models, pre_tokenizers, Tokenizer, trainers

from graphc.compiler.cache_dir import cache_root
from graphc.compiler.chat_templates import CHATML

PACKAGE_DIR = Path(__file__).resolve().parent
CORPUS_DIR = PACKAGE_DIR / "corpus"
SHIPPED_DIR = PACKAGE_DIR / "tokenizers"

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Order fixes the ids: 0, 1, 2. <|endoftext|> separates documents in training
# and doubles as bos/pad (as in GPT-2); <|im_end|> ends a chat turn.
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

# ChatML, the same shape Qwen uses; kept free of tool-call markers so that
# mlx-lm's tool-parser sniffing leaves it alone.
CHAT_TEMPLATE = CHATML  # compiler/chat_templates.py, also `graphc serve --chat-template chatml`

# ChatML that knows tools, Hermes/Qwen style: the functions go into the system turn as JSON,
# calls are <tool_call>{"name", "arguments"}</tool_call>, results come back as role "tool".
# For tests of tool calling (`graphc make-model --chat-template tools`).
TOOLS_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- 'Functions you may call, one JSON object per line:\n' }}"
    "{%- for tool in tools %}{{- tool | tojson + '\n' }}{%- endfor %}"
    "{{- 'To call one, answer <tool_call>\n{\"name\": NAME, \"arguments\": ARGS}\n</tool_call>'"
    " + '<|im_end|>\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] %}"
    "{{- '<tool_call>\n' + {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson"
    " + '\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
CHAT_TEMPLATES = {"chatml": CHAT_TEMPLATE, "tools": TOOLS_CHAT_TEMPLATE}

MIN_VOCAB = 256 + len(SPECIAL_TOKENS)


def corpus_files() -> list[Path]:
    files = sorted(CORPUS_DIR.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no corpus text found under {CORPUS_DIR}")
    return files


def corpus_text() -> str:
    """All corpus files, each a document ending in <|endoftext|>-free text."""
    return "\n\n".join(p.read_text(encoding="utf-8") for p in corpus_files())


def corpus_hash() -> str:
    h = hashlib.sha256()
    for p in corpus_files():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def special_token_ids() -> dict[str, int]:
    return {t: i for i, t in enumerate(SPECIAL_TOKENS)}


def train_tokenizer(vocab_size: int):
    """Train a byte-level BPE on the corpus. Returns a ``tokenizers.Tokenizer``."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(
            f"vocab_size must be at least {MIN_VOCAB} (256 bytes + "
            f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = [str(p) for p in corpus_files()]
    tok.train(files, trainer)
    return tok


def shipped_tokenizer_path(vocab_size: int) -> Path:
    return SHIPPED_DIR / f"bpe-{vocab_size}.json"


def tokenizer_json(vocab_size: int) -> str:
    """The tokenizer.json text for ``vocab_size``: shipped, cached, or trained now."""
    shipped = shipped_tokenizer_path(vocab_size)
    if shipped.exists():
        return shipped.read_text(encoding="utf-8")
    cached = cache_root() / "tokenizers" / f"bpe-{vocab_size}-{corpus_hash()}.json"
    if cached.exists():
        return cached.read_text(encoding="utf-8")
    text = train_tokenizer(vocab_size).to_str(pretty=False)
    cached.parent.mkdir(parents=True, exist_ok=True)
    # Write-then-rename so a concurrent reader never sees a half-written file.
    fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, cached)
    return text


def tokenizer_config(chat_template: str = "chatml") -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": ENDOFTEXT,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        # Byte-level BPE is lossless; cleanup would break decode(encode(x)) == x.
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATES[chat_template],
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, t in enumerate(SPECIAL_TOKENS)
        },
    }


def write_tokenizer(out: Path, vocab_size: int, chat_template: str = "chatml") -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    out = Path(out)
    (out / "tokenizer.json").write_text(tokenizer_json(vocab_size), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(chat_template), indent=2) + "\n", encoding="utf-8"
    )
    special_map = {
        "bos_token": ENDOFTEXT,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "additional_special_tokens": [IM_START, IM_END],
    }
    (out / "special_tokens_map.json").write_text(
        json.dumps(special_map, indent=2) + "\n", encoding="utf-8"
    )
