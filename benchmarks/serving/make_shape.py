"""Write a bench shape (benchmarks/shapes.py: llama-3.2-1b, llama-3.1-8b, ...) as a model folder
both servers can load: config.json, random bf16 weights, and make-model's BPE tokenizer.

`graphc make-model` draws weights with numpy on the host (minutes for 8B); this draws them with
MLX on the default device, so an 8B folder takes seconds on a GPU plus the write.

    python -m graphc.benchmarks.serving.make_shape llama-3.1-8b /tmp/llama-8b
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from graphc.compiler.modelgen.archs import Dims, build_config
from graphc.compiler.modelgen.tokenizer import write_tokenizer

from ..shapes import SHAPES, random_model


def make_shape(name: str, out: str | Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    shape = dict(SHAPES[name])
    # make-model's config of the shape's architecture gives the token ids of its tokenizer (bos/eos);
    # the shape gives the sizes.
    dims = Dims(hidden_size=shape["hidden_size"], num_layers=shape["num_hidden_layers"],
                num_heads=shape["num_attention_heads"], num_kv_heads=shape["num_key_value_heads"],
                head_dim=shape["head_dim"], intermediate_size=shape["intermediate_size"],
                vocab_size=shape["vocab_size"], sliding_window=None)
    cfg = {**build_config(shape["model_type"], dims, {}), **shape, "torch_dtype": dtype}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out, cfg["vocab_size"])
    cover_vocab(out / "tokenizer.json", cfg["vocab_size"])
    model = random_model(cfg, getattr(mx, dtype), seed)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def cover_vocab(path: Path, vocab_size: int) -> int:
    """Give every id up to `vocab_size` a token (filler entries no merge reaches, so text still
    tokenizes as before); returns how many were added. make-model's BPE tokenizer learns ~17.5k
    tokens, and random weights generate ids all over a 128k vocabulary: the ids past it decode
    to "" in graphc (as in HF `decode`) but to "!" in mlx_lm.server's streaming detokenizer, so
    graphc's stream skipped most tokens' chunks and its inter-chunk gaps spanned several tokens
    while mlx_lm.server's were one token each. With every id a text, both stream a chunk per token."""
    tok = json.loads(path.read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    taken = set(vocab.values()) | {a["id"] for a in tok.get("added_tokens", [])}
    added = 0
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"Ġw{i}"] = i  # "Ġ" is the byte-level space: decodes to " w<id>"
            added += 1
    path.write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    return added


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m graphc.benchmarks.serving.make_shape", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=[s for s in SHAPES if s != "tiny"])
    ap.add_argument("out")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    path = make_shape(a.shape, a.out, a.dtype, a.seed)
    print(f"wrote {a.shape} ({a.dtype}) to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
