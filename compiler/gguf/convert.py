"""A GGUF file -> a normal mlx-lm model folder, written once and then loaded like any other.

`import_gguf` writes config.json, model.safetensors (quantized tensors kept as stored),
tokenizer.json, tokenizer_config.json and special_tokens_map.json. `resolve_model_path`
lets every loader take a .gguf path: the folder is made once under the cache directory
(~/.cache/graphc/gguf/<key>, or $GRAPHC_CACHE_DIR/gguf/<key>), keyed by the file's path, size,
mtime and the converter's version, so editing or replacing the file converts it again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
from graphc.compiler.cache_dir import cache_root as shared_cache_root

from .arch import arch_of, make_config
from .reader import GGUFError, read_header
from .tokenizer import eos_ids, token_ids, write_tokenizer
from .weights import check_types, convert_weights

# Bump when the folder layout or a conversion rule changes: cached folders are then rebuilt.
CONVERTER_VERSION = 2


def _say(progress, msg):
    if progress:
        progress(msg)


def import_gguf(path: str | Path, out: str | Path, progress=None, widen_dtype: str = "float16") -> Path:
    """Convert `path` into the model folder `out` (created; must be empty or absent).

    Types with no exact MLX form (Q2_K, Q3_K, Q6_K, IQ4_*) are widened to `widen_dtype`."""
    path, out = Path(path), Path(out)
    if not path.is_file():
        raise GGUFError(f"the GGUF file '{path}' does not exist")
    if out.exists() and any(out.iterdir()):
        raise GGUFError(f"'{out}' is not empty; give a new folder for the converted model")
    t0 = time.perf_counter()
    header = read_header(path)
    arch_name, arch = arch_of(header, path)
    check_types(header, path)
    _say(progress, f"graphc: importing {path.name} ({arch_name}, {len(header.tensors)} tensors, "
                   f"{path.stat().st_size / 2**20:.0f} MiB)")
    names = {t.name for t in header.tensors}
    embed = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise GGUFError(f"{path}: no token_embd.weight tensor; this is not a complete model file")
    vocab_size = embed.shape[0]
    ids = token_ids(header)
    eos = eos_ids(header)
    if not eos:
        raise GGUFError(f"{path}: the metadata names no EOS token (tokenizer.ggml.eos_token_id); "
                        "generation could not stop")
    config = make_config(header, path, arch_name, arch, vocab_size, tied="output.weight" not in names,
                         eos_ids=eos, bos_id=ids["bos"])
    weights, quant, report = convert_weights(header, path, arch, config, widen_dtype)
    for type_name, rep in sorted(report.items()):
        _say(progress, f"graphc:   {rep.line(type_name)}")
    if quant is not None:
        config["quantization"] = quant
        config["quantization_config"] = quant  # mlx-lm writes both; some tools read the second
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(header, path, out, config.get("max_position_embeddings"))
    _say(progress, f"graphc: writing {len(weights)} tensors to {out}")
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    config["graphc_gguf"] = {"source": str(path.resolve()), "converter_version": CONVERTER_VERSION,
                             "widen_dtype": widen_dtype,
                             "types": {k: {"fate": r.fate, "tensors": r.tensors, "values": r.values,
                                           "file_bytes": r.file_bytes, "out_bytes": r.out_bytes,
                                           "transposed": r.transposed}
                                       for k, r in sorted(report.items())}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _say(progress, f"graphc: imported in {time.perf_counter() - t0:.1f}s")
    return out


def cache_root() -> Path:
    return shared_cache_root()  # compiler/cache_dir.py: $GRAPHC_CACHE_DIR (GRAPHC_CACHE still read)


def cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v{CONVERTER_VERSION}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def is_gguf(path: str | Path) -> bool:
    p = Path(path)
    return p.suffix.lower() == ".gguf" and p.is_file()


def resolve_model_path(path: str | Path, progress=lambda m: print(m, file=sys.stderr)) -> Path:
    """A model folder as given, or the cached converted folder of a .gguf file (made on first use)."""
    p = Path(path)
    if p.suffix.lower() == ".gguf" and not p.exists():
        raise GGUFError(f"the GGUF file '{p}' does not exist")
    if not is_gguf(p):
        return p
    folder = cache_root() / "gguf" / f"{p.stem}-{cache_key(p)}"
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temporary sibling and rename it: a crash or a second process never leaves
    # (or reads) a half-written folder.
    tmp = Path(tempfile.mkdtemp(prefix=f".{p.stem}-", dir=folder.parent))
    try:
        import_gguf(p, tmp, progress=progress)
        try:
            tmp.rename(folder)
        except OSError:  # another process finished first; use its folder
            if not (folder / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _say(progress, f"graphc: cached the converted model in {folder}")
    return folder
