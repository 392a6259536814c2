"""`Engine.load(..., distributed=True)`: load a model folder sharded over the world group.

Every rank loads the same folder lazily, lets the model shard itself (`model.shard(group)`,
mlx-lm's tensor parallelism: attention heads, KV heads and MLP/expert columns split across
ranks, one all_sum after attention and one after the MLP), then builds the same Engine over its
shard (of the class `Engine.load` was called on, passed in as `engine_cls`: this module is
below the engine). Rank 0 gets a LeaderEngine back; every other rank follows rank 0's steps here and
exits the process when rank 0 shuts down (so a script's code after `Engine.load` runs on
rank 0 only).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import mlx.core as mx
import mlx_lm
import mlx_lm.models

from graphc.compiler.modelgen import demo_model_path

from ..tokenizer_setup import quiet_length_warning
from .follower import follow
from .group import GroupFailed, broadcast_ints, crc, gather_ints, world
from .leader import leader_class
from .launcher_watch import stop_with_parent
from .watchdog import Watchdog, default_timeout

log = logging.getLogger("graphc.distributed")


def load_sharded(model_dir, graph=None, *, engine_cls: type, timeout: float | None = None,
                 heartbeat_s: float = 1.0, **kwargs):
    """`engine_cls.load(model_dir, graph, distributed=True, **kwargs)`."""
    watchdog, group = _join(timeout)
    if group.size() == 1:
        log.warning("distributed=True but this process was not launched as part of a group "
                    "(world size 1): serving on this process alone")
        return engine_cls.load(model_dir, graph, **kwargs)
    if group.rank() == 0:
        stop_with_parent()  # SIGTERM to mlx.launch ends the group (runtime/distributed/launcher_watch.py)
    try:
        path, config, model, tokenizer = _load_shard(model_dir, group, kwargs)
        loaded, error = (model, tokenizer, config, str(path)), None
    except Exception as e:  # reported after every rank said how its load went
        loaded, error = None, e
    return _start(engine_cls, group, watchdog, loaded, error, graph, timeout, heartbeat_s, kwargs)


def engine_from_model(model, tokenizer, config: dict, graph=None, *, engine_cls: type, model_path: str | None = None,
                      timeout: float | None = None, heartbeat_s: float = 1.0, **kwargs):
    """Like load_sharded, for a model already in memory with the same weights on every rank (the
    bench's random shapes): shard it in place, then build the engine; a plain Engine outside a launch."""
    watchdog, group = _join(timeout)
    if group.size() == 1:
        return engine_cls(model, tokenizer, config, graph, model_path=model_path, **kwargs)
    try:
        _check_options(kwargs)
        check_shardable(model, config, group.size())
        model.shard(group)
        mx.eval(model.parameters())
        loaded, error = (model, tokenizer, config, model_path), None
    except Exception as e:
        loaded, error = None, e
    return _start(engine_cls, group, watchdog, loaded, error, graph, timeout, heartbeat_s, kwargs)


def _join(timeout):
    """The watchdog, then the group. Joining comes before anything that can fail: a rank that
    fails alone must still reach the status exchange in _start, or the others wait in init forever."""
    load_timeout = max(600.0, default_timeout() if timeout is None else float(timeout))
    watchdog = Watchdog(int(os.environ.get("MLX_RANK", "-1")))
    with watchdog.armed("joining the group (mx.distributed.init): a rank did not start or cannot be reached",
                        load_timeout):
        group = world()
    watchdog.rank = group.rank()
    return watchdog, group


def _start(engine_cls: type, group, watchdog: Watchdog, loaded, error, graph, timeout, heartbeat_s: float,
           kwargs: dict):
    """Every rank's load status, the setup check, the shared seed, then the engine: returned on
    rank 0; the other ranks follow rank 0 here and leave through SystemExit."""
    timeout = default_timeout() if timeout is None else float(timeout)
    rank, n = group.rank(), group.size()
    # Reading a large model can take minutes on the slowest rank: a longer deadline.
    with watchdog.armed(f"rank {rank}: waiting for every rank to load the model", max(600.0, timeout)):
        failed = [r for r, (bad,) in enumerate(gather_ints(group, [int(error is not None)])) if bad]
        if error is not None:
            raise error
        if failed:
            raise GroupFailed(f"rank(s) {failed} could not load the model (each printed why); "
                              "every rank needs the same model folder at the same path")
        model, tokenizer, config, path = loaded
        _check_same_setup(group, config, graph, kwargs)
        # Requests get their noise seeds (rows without a seed) from the Engine's generator, in the
        # order the plans add them: one seed for every rank's generator, the same seeds.
        kwargs = dict(kwargs)
        seed = kwargs.pop("seed", None)
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        seed = broadcast_ints(group, [seed], 1)[0]
        cls = leader_class(engine_cls) if rank == 0 else engine_cls
        engine = cls(model, tokenizer, config, graph, model_path=path, seed=seed, **kwargs)
        engine = _same_prefix_capacity(group, engine, cls, (model, tokenizer, config, graph, path, seed), kwargs)
    log.info("rank %d of %d: %s sharded %d ways", rank, n, config.get("model_type"), n)
    if rank == 0:
        engine.start_group(group, watchdog, timeout=timeout, heartbeat_s=heartbeat_s)
        return engine
    raise SystemExit(follow(engine, group, watchdog, timeout=timeout))


def _check_options(kwargs: dict) -> None:
    """Options a sharded engine takes differently. compile: the decode forward is traced through
    the model's own sharded layers (their all_sums included), so projection fusion, which would
    read the layers' weights around them, is turned off. Every rank replays rank 0's steps and
    must take the same decisions from the same state, so nothing may be chosen by timing: the
    speculative gate is off and compile="measured" is refused (runtime/measured_gate.py)."""
    if kwargs.get("compile") == "measured":
        raise ValueError("compile='measured' is not supported with distributed=True: each rank would time its "
                         "own steps and could pick another step than rank 0, so their collectives would not "
                         "match; use compile=True or 'auto'")
    if kwargs.get("spec_adaptive"):
        raise ValueError("spec_adaptive is not supported with distributed=True: each rank would time its own "
                         "steps and could verify where rank 0 does not; leave it unset (verify whenever a row "
                         "drafted)")
    kwargs["spec_adaptive"] = False
    if kwargs.get("compile"):
        opts = dict(kwargs.get("decode_options") or {})
        if opts.get("fuse_projections"):
            raise ValueError("decode option fuse_projections is not supported with distributed=True: fused "
                             "projections bypass the sharded layers; leave it off (compile alone works)")
        opts["fuse_projections"] = False
        kwargs["decode_options"] = opts


def _load_shard(model_dir, group, kwargs: dict):
    """This rank's slices of the model (lazy load, the model's own shard(), then materialize)."""
    if model_dir is None:
        model_dir = demo_model_path()
    path = Path(model_dir)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no model folder at '{model_dir}' (expected a config.json there) on rank "
                                f"{group.rank()}; every rank needs the model folder at the same path")
    _check_options(kwargs)
    config = json.loads((path / "config.json").read_text())
    model, tokenizer = mlx_lm.load(str(path), lazy=True)
    quiet_length_warning(tokenizer)
    check_shardable(model, config, group.size())
    model.shard(group)
    mx.eval(model.parameters())
    return path, config, model, tokenizer


def shardable_model_types() -> list[str]:
    """mlx-lm architectures whose Model has a tensor-parallel `shard()` (read off the sources)."""
    d = Path(mlx_lm.models.__file__).parent
    return sorted(p.stem for p in d.glob("*.py") if "def shard(" in p.read_text(errors="ignore"))


def check_shardable(model, config: dict, n: int) -> None:
    """Refuse, with the reason, what tensor parallelism over `n` ranks cannot split."""
    mt = config.get("model_type", type(model).__module__)
    if not hasattr(model, "shard"):
        raise ValueError(
            f"model type '{mt}' cannot be served on {n} ranks: mlx-lm {mlx_lm.__version__} has no tensor-parallel "
            f"shard() for it (architectures that have one: {', '.join(shardable_model_types())}); "
            "serve it on one process (without mlx.launch)")
    text = config.get("text_config", config)
    for name, what in (("num_attention_heads", "attention heads"), ("num_key_value_heads", "KV heads"),
                       ("intermediate_size", "MLP columns"), ("moe_intermediate_size", "expert MLP columns")):
        v = text.get(name)
        if isinstance(v, int) and v % n:
            raise ValueError(f"model type '{mt}': {name} = {v} does not divide over {n} ranks (tensor parallelism "
                             f"splits the {what} evenly); launch with a rank count that divides {v}")


def _check_same_setup(group, config: dict, graph, kwargs: dict) -> None:
    """Every rank must run the same model with the same engine settings, or their schedules differ."""
    setup = json.dumps({"config": config, "graph": str(graph), "engine": {k: repr(v) for k, v in sorted(kwargs.items())},
                        "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__}, sort_keys=True, default=str)
    digests = [row[0] for row in gather_ints(group, [crc(setup.encode())])]
    odd = [r for r, d in enumerate(digests) if d != digests[0]]
    if odd:
        raise GroupFailed(f"ranks {odd} run a different model config, graph, engine settings or mlx/mlx-lm version "
                          "than rank 0; launch every rank with the same command and the same model folder")


def _same_prefix_capacity(group, engine, cls, args, kwargs):
    """The prefix pool's size comes from each host's memory: take the smallest, so every rank
    evicts the same entries at the same step."""
    cap = engine.prefix.slots.capacity if engine.prefix is not None else 0
    caps = [row[0] for row in gather_ints(group, [cap])]
    if len(set(caps)) == 1:
        return engine
    model, tokenizer, config, graph, path, seed = args
    return cls(model, tokenizer, config, graph, model_path=path, seed=seed,
               **{**kwargs, "max_total_tokens": min(caps)})
