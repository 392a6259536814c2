"""The load-time self-check's verdict, kept on disk so that a second start of the same model skips it.

The self-check (compiler/selfcheck.py) runs mlx-lm's own forward and graphc's lowered steps
on a dozen tokens; on a real model on a CPU that is most of the load (SmolLM2-135M Q4_1 on
a shared 2-core CPU: 5.6 s of a ~10 s `graphc generate`, docs/quickstart.md). Its verdict —
the layer kinds, the lowering that matched, whether rows may share a forward, the vocabulary
width, every check's numbers — depends only on what is keyed here:

- the model: the path the user named, each weight / config file's name, size and mtime there
  (a .gguf file: the file itself), the config dict, and the loaded parameters' names, shapes
  and dtypes (a cast or quantized-in-memory model has other ones);
- the graph's text (or "auto"), the lowering asked for, and kv_bits / kv_group_size;
- graphc's own code (a digest of its compiler / runtime / contracts sources and built-in
  graphs, so an edit invalidates it even without a version bump), mlx's and mlx-lm's
  versions, and the device.

Only passing verdicts on graphc's batched caches are kept: a model served on mlx-lm's own
caches (whose layers hold a live cache object), a graph with `plugins:` (Python outside the
digest), an embedding / scoring graph and a refusal are checked at every start. So are engines
built from an in-memory model without a path (or with one that names no file or folder), and every rank of a distributed launch (a rank
that skipped the check while another ran it would leave the other waiting in a collective).
GRAPHC_SELFCHECK=always checks at every start and neither reads nor writes a verdict (the
tests run that way); the files live under $GRAPHC_CACHE_DIR/selfcheck.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from functools import cache
from importlib import metadata
from pathlib import Path

import attrs
import mlx.core as mx
from mlx.utils import tree_flatten

from .adapters import adapter_files
from .bind import bind, default_graph_for
from .cache_dir import cache_root
from .cachekinds import LayerInfo
from .compile import CompiledGraph, compile_graph, load_spec, with_kv_bits
from .lower import lower
from .ops import OPS
from .parse import resolve_graph_path
from .selfcheck import CheckResult
from .target import Requested, Target

log = logging.getLogger("graphc.compile")

SCHEMA = 1  # bump when the stored fields change
MODES = ("cached", "always")
_WEIGHT_SUFFIXES = (".safetensors", ".json", ".gguf", ".npz", ".bin")
_PACKAGE = Path(__file__).resolve().parents[1]


def mode() -> str:
    """GRAPHC_SELFCHECK: "cached" (the default: reuse a stored verdict) or "always" (check at every start)."""
    value = os.environ.get("GRAPHC_SELFCHECK", "cached").strip().lower() or "cached"
    if value not in MODES:
        raise ValueError(f"GRAPHC_SELFCHECK={value!r}: expected one of {', '.join(MODES)} "
                         "(always: run the load-time self-check at every start)")
    return value


@cache
def source_digest() -> str:
    """A digest of graphc's compiler, runtime and contracts code and built-in graphs (what the verdict depends on)."""
    h = hashlib.sha256()
    for sub in ("compiler", "runtime", "contracts", "graphs"):
        for p in sorted((_PACKAGE / sub).rglob("*")):
            if p.suffix in (".py", ".yaml", ".yml", ".jinja", ".j2") and p.is_file():
                h.update(str(p.relative_to(_PACKAGE)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _files(model_path: str, adapter_path: str | None = None) -> list:
    p = Path(model_path)
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in _WEIGHT_SUFFIXES and f.is_file())
    else:
        return []
    files += adapter_files(adapter_path)  # a LoRA adapter changes the model the check ran
    return [(str(f.resolve()) if f.parent != p else f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def verdict_key(model, model_path: str, config: dict, graph, lowering: str,
                kv_bits: int | None = None, kv_group_size: int | None = None, kernels: tuple = (),
                linear_prefill: str = "auto", adapter_path: str | None = None) -> str:
    """The key of a verdict: sha256 over everything the self-check's outcome depends on (module doc).
    `kernels`: the target's kernels that matched here, which a policy's caches may run on
    (bind's `for_target`: quantized KV on CUDA attends in graphc's kernel only where it matched).
    `linear_prefill`: what the engine asked of gated-delta prompt chunks (the checked prefill runs
    them chunked or as mlx-lm's loop); "auto" (decided by the device, already in the key) adds nothing."""
    params = [(k, tuple(v.shape), str(v.dtype)) for k, v in tree_flatten(model.parameters())]
    graph_text = "auto" if graph is None else resolve_graph_path(graph).read_text()
    parts = {
        "schema": SCHEMA, "path": str(Path(model_path).resolve()), "files": _files(model_path, adapter_path),
        "config": config, "params": params, "graph": graph_text, "lowering": lowering,
        "kv": [kv_bits, kv_group_size],
        "graphc": [_version("graphc"), source_digest()], "mlx": _version("mlx"), "mlx_lm": _version("mlx-lm"),
        "device": str(mx.default_device()), "kernels": list(kernels),
    }
    if linear_prefill != "auto":
        parts["linear_prefill"] = linear_prefill
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _layer_dict(info: LayerInfo) -> dict:
    d = attrs.asdict(info, recurse=False, filter=lambda a, _: a.name not in ("native", "parts"))
    d["parts"] = [_layer_dict(p) for p in info.parts]
    return d


def _layer_from(d: dict) -> LayerInfo:
    return LayerInfo(**{**d, "parts": tuple(_layer_from(p) for p in d["parts"])})


def _graphc_code(compiled: CompiledGraph) -> bool:
    """Every policy and op the graph runs is graphc's own (inside source_digest), not a plugin's
    or one a script registered in-process: their code could change under the same key."""
    mods = [type(p).__module__ for p in compiled.binding.policies]
    mods += [OPS[n.op].module for n in compiled.spec.nodes if n.op in OPS]
    return all(m.startswith("graphc.") for m in mods) and all(n.op in OPS for n in compiled.spec.nodes)


def _cacheable(compiled: CompiledGraph) -> bool:
    b = compiled.binding
    return (b.check is not None and b.check.ok and not compiled.spec.plugins
            and "next_tokens" in compiled.spec.output_dict and _graphc_code(compiled)
            and not any(i.kind == "native" or i.native is not None for i in b.layers))


def _store(path: Path, compiled: CompiledGraph) -> None:
    b = compiled.binding
    record = {"schema": SCHEMA, "model_type": b.model_type,
              "lowering": b.lowering, "batched": b.batched, "mask_rank": b.mask_rank,
              "vocab": compiled.vocab_size, "layers": [_layer_dict(i) for i in b.layers],
              "checks": [attrs.asdict(c) for c in b.checks], "check": b.checks.index(b.check)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)  # whole or absent: a second process never reads half a verdict


def _rebuild(record: dict, graph, model, config: dict, kv_bits, kv_group_size, target: Target,
             requested: Requested) -> CompiledGraph:
    """The compiled graph a stored verdict describes: bound and lowered as compile_graph does, no check run."""
    if record.get("schema") != SCHEMA:
        raise ValueError(f"schema {record.get('schema')!r}, this graphc writes {SCHEMA}")
    layers = [_layer_from(d) for d in record["layers"]]
    spec = load_spec(default_graph_for(layers) if graph is None else graph, config)
    if kv_bits is not None:
        spec = with_kv_bits(spec, kv_bits, kv_group_size)
    checks = tuple(CheckResult(**c) for c in record["checks"])
    check = checks[record["check"]]
    if not check.ok:
        raise ValueError("the stored verdict is not a passing check")
    binding = attrs.evolve(bind(spec, model, config, layers, record["model_type"], target=target),
                           checks=checks, check=check, lowering=record["lowering"], batched=record["batched"],
                           mask_rank=record["mask_rank"])
    # The plans' choice passes run on this start's target and requested options: they are not
    # part of the verdict (they follow the check, as in compile.py's _checked).
    return CompiledGraph(spec, binding, lower(binding, "prefill", target, requested),
                         lower(binding, "decode", target, requested), vocab_size=int(record["vocab"]),
                         target=target, requested=requested)


def _distributed() -> bool:
    return mx.distributed.is_available() and mx.distributed.init().size() > 1


def verdict_path(key: str) -> Path:
    return cache_root() / "selfcheck" / f"{key}.json"


def compile_cached(graph, model, config: dict, lowering: str = "auto", kv_bits: int | None = None,
                   kv_group_size: int | None = None, *, target: Target | None = None,
                   requested: Requested | None = None, model_path: str | None = None,
                   adapter_path: str | None = None) -> CompiledGraph:
    """compile_graph, with the self-check's verdict read from / written to the cache when the model has a path."""
    target, requested = target or Target(), requested or Requested()
    compile_kw = dict(lowering=lowering, kv_bits=kv_bits, kv_group_size=kv_group_size, target=target,
                      requested=requested)
    # A path that names no file or folder is a label (the bench's random-weight shapes): the
    # weights did not come from files the key could see.
    if model_path is None or mode() == "always" or not Path(model_path).exists() or _distributed():
        return compile_graph(graph, model, config, **compile_kw)
    key = verdict_key(model, model_path, config, graph, lowering, kv_bits, kv_group_size,
                      kernels=tuple(sorted(n for n, why, _ in target.kernels if why is None)),
                      linear_prefill=requested.linear_prefill, adapter_path=adapter_path)
    path = verdict_path(key)
    if path.is_file():
        try:
            compiled = _rebuild(json.loads(path.read_text()), graph, model, config, kv_bits, kv_group_size, target,
                                requested)
            log.info("model type '%s': %s lowering, self-check skipped: this model, graph and graphc passed it "
                     "before (%s; %s). GRAPHC_SELFCHECK=always runs it at every start",
                     compiled.binding.model_type, compiled.binding.lowering, compiled.binding.check.describe(), path)
            return compiled
        except Exception as e:  # noqa: BLE001 - a stale or damaged file is a miss, never a failed load
            log.warning("self-check: ignoring the stored verdict %s (%s: %s); checking again", path,
                        type(e).__name__, e)
    compiled = compile_graph(graph, model, config, **compile_kw)
    if _cacheable(compiled):
        try:
            _store(path, compiled)
        except OSError as e:  # a read-only cache folder costs the next start the check, nothing else
            log.warning("self-check: could not store the verdict in %s: %s", path, e)
    return compiled
