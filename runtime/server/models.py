"""Several models behind one server: a registry of named ServerStates, loaded on first use and
unloaded least-recently-used under a budget.

    graphc serve --model llama=/models/llama --model qwen=/models/qwen --max-loaded-models 1
    graphc serve --models-dir /models --max-loaded-bytes 8G

Every name and path is fixed when the server starts (flags, or the folders of --models-dir);
a request's `model` only picks among those names, so no request can make the server open a
file. Each model keeps one ServerState for the server's life; its engine comes and goes:

- the first model loads at startup, the others on the first request that names them;
- a request for a model that is not loaded starts its load and gets 503 + Retry-After (as
  does every request for it until the load ends), the way a single server answers while it
  starts; load progress goes to the log;
- before a load, least-recently-used models with no sequences in flight are unloaded until
  the newcomer fits `max_loaded_models` and `max_loaded_bytes` (bytes are the weight files'
  sizes on disk); when every loaded model is busy the request gets 503 instead.

Routes reach the registry through ServerState.route(name): a single-model server has no
registry and route() is the old model-name check.
"""

from __future__ import annotations

import collections
import gc
import logging
import re
import threading
from pathlib import Path
from typing import Callable

import attrs
import mlx.core as mx

from graphc.runtime import gc_pauses
from graphc.runtime.engine import Engine

from .config import ServerConfig
from .errors import APIError
from .metrics import ServerMetrics
from .state import ServerState

log = logging.getLogger("graphc.server")

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".npz", ".bin")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def parse_model_spec(spec: str) -> tuple[str, str]:
    """`NAME=PATH` or `PATH` (named after the folder, or the .gguf file's stem)."""
    name, sep, path = spec.partition("=")
    if sep and _NAME.match(name) and path:
        return name, path
    p = Path(spec)
    return (p.stem if p.suffix == ".gguf" else p.name), spec


def scan_models_dir(folder: str) -> list[tuple[str, str]]:
    """Each model folder (one with a config.json) and .gguf file directly inside `folder`, by name."""
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"--models-dir {folder}: not a folder")
    found = [(p.name, str(p)) for p in sorted(root.iterdir()) if p.is_dir() and (p / "config.json").exists()]
    found += [(p.stem, str(p)) for p in sorted(root.glob("*.gguf")) if p.is_file()]
    return found


def model_entries(config: ServerConfig) -> list[tuple[str, str]]:
    """(name, path) of every model `config` names, in order; a name twice is an error."""
    entries = [parse_model_spec(s) for s in config.models or ()]
    if config.models_dir:
        entries += scan_models_dir(config.models_dir)
    if not entries:
        raise ValueError("no models to serve: give --model (one or more) or a --models-dir with model folders")
    names = [n for n, _ in entries]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ValueError(f"two models are named '{dup}'; name them apart with --model NAME=PATH")
    bad = next((n for n in names if not _NAME.match(n)), None)
    if bad is not None:
        raise ValueError(f"model name {bad!r}: use letters, digits and . _ : - (at most 128)")
    return entries


def weight_bytes(path: str) -> int:
    """The size on disk of a model's weights (its budget cost): a .gguf file, or a folder's weight files."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    if not p.is_dir():
        return 0
    return sum(f.stat().st_size for f in p.iterdir() if f.is_file() and f.suffix in WEIGHT_SUFFIXES)


class ModelRegistry:
    """Named models, each a ServerState whose engine loads on demand and unloads under the budget."""

    def __init__(self, config: ServerConfig, loader: Callable[[str, str], Engine] | None = None,
                 metrics: ServerMetrics | None = None):
        self.config = config
        self.metrics = metrics or ServerMetrics()
        self.max_loaded = config.max_loaded_models
        self.max_bytes = config.max_loaded_bytes
        self.states: dict[str, ServerState] = {}
        self.sizes: dict[str, int] = {}
        self._lru: collections.OrderedDict[str, None] = collections.OrderedDict()  # loaded or loading, oldest first
        self._lock = threading.Lock()
        for name, path in model_entries(config):
            cfg = attrs.evolve(config, model=path, served_model_name=name, models=None, models_dir=None)
            own = (lambda n=name, p=path: loader(n, p)) if loader is not None else None
            st = ServerState(cfg, loader=own)
            st.metrics = self.metrics  # one /metrics for the server
            st.registry = self
            self.states[name] = st
            self.sizes[name] = weight_bytes(path)
        self.default = next(iter(self.states))

    @property
    def first(self) -> ServerState:
        return self.states[self.default]

    def start(self) -> None:
        """Load the first model now (in the background, as a single server does)."""
        with self._lock:
            self._begin_load(self.default)

    def status(self, name: str) -> str:
        st = self.states[name]
        if st.ready:
            return "loaded"
        if st.loading:
            return "loading"
        return "failed" if st.load_error else "unloaded"

    def get(self, model: str | None) -> ServerState:
        """The state named `model` (None: the first model), loaded or not; 404 for other names."""
        name = self.default if model is None else model
        st = self.states.get(name)
        if st is None:
            shown = name if len(name) <= 100 else name[:100] + "…"  # never echo a whole hostile value
            raise APIError(404, f"the model '{shown}' does not exist; this server serves "
                                f"{', '.join(repr(n) for n in self.states)}", param="model", code="model_not_found")
        return st

    def route(self, model: str | None) -> ServerState:
        """The state a request for `model` runs on: ready, or failed (its require_ready says so);
        a model not loaded starts loading and the request gets 503 + Retry-After."""
        st = self.get(model)
        with self._lock:
            name = st.model_name
            if st.ready or st.load_error is not None or st.draining:
                if name in self._lru:
                    self._lru.move_to_end(name)
                return st
            if not st.loading:
                self._make_room(name)
                self._begin_load(name)
        raise APIError(503, f"the model '{name}' is loading; retry shortly", code="model_loading",
                       headers={"Retry-After": "2"})

    # -- loading and unloading (under self._lock) -----------------------------------------------
    def _begin_load(self, name: str) -> None:
        st = self.states[name]
        loaded = sum(1 for n in self._lru if n != name)
        log.info("loading model '%s' from %s (%s of weights; %d other model(s) loaded)",
                 name, st.config.model, _size(self.sizes[name]), loaded)
        self._lru[name] = None
        self._lru.move_to_end(name)
        st.start()

    def _fits(self, name: str) -> bool:
        others = [n for n in self._lru if n != name and (self.states[n].ready or self.states[n].loading)]
        if self.max_loaded is not None and len(others) + 1 > self.max_loaded:
            return False
        if self.max_bytes is not None and sum(self.sizes[n] for n in others) + self.sizes[name] > self.max_bytes:
            return False
        return True

    def _make_room(self, name: str) -> None:
        while not self._fits(name):
            victim = next((n for n in self._lru if n != name and self._idle(self.states[n])), None)
            if victim is None:
                busy = ", ".join(n for n in self._lru if n != name)
                raise APIError(503, f"the model '{name}' cannot load while the loaded models ({busy}) are busy; "
                                    "retry shortly", code="model_capacity", headers={"Retry-After": "5"})
            self._unload(victim, f"least recently used; making room for '{name}'")

    @staticmethod
    def _idle(st: ServerState) -> bool:
        if st.loading:
            return False  # its loader thread still runs: unloading now would race it
        return st.aengine is None or st.aengine.num_inflight == 0

    def _unload(self, name: str, why: str) -> None:
        log.info("unloading model '%s' (%s)", name, why)
        self._lru.pop(name, None)
        self.states[name].unload()
        gc_pauses.unfreeze()  # its objects were frozen at load (--gc-freeze): collectable again
        gc.collect()  # the engine's arrays go now, before the next model's weights arrive
        mx.clear_cache()

    def begin_drain(self) -> None:
        for st in self.states.values():
            st.draining = True

    def stop(self) -> None:
        for st in self.states.values():
            st.stop_own()


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
