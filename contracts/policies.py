"""The cache-policy registry, and what the compiler relies on a policy for.

A graph's `cache:` section names a policy per layer type; the compiler looks the name
up here (validation), instantiates the class per layer (binding) and runs its caches in
the load-time self-check; the runtime batches those caches. A user adds a policy with a
class and a YAML line:

    from graphc.runtime.cache import CachePolicy, register_policy   # or graphc.contracts

    @register_policy("my_policy")
    class MyPolicy(CachePolicy): ...

and in the graph: `cache: {full_attention: {policy: my_policy}}`.

The built-in policies are runtime code (runtime/cache/), declared as the entry points of group
`graphc.cache_policies` (pyproject.toml); BUILTIN_POLICIES maps each name to the module that
registers it, imported on first lookup (contracts/providers.py says why).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from .providers import entry_points, provider

POLICY_GROUP = "graphc.cache_policies"


def builtin_policies() -> dict[str, str]:
    """name -> the module whose import registers it (graphc's entry points, read once)."""
    found = {name: ep.module for name, ep in entry_points(POLICY_GROUP).items()}
    if not found:  # an install from before the entry points existed: say so instead of "unknown policy"
        raise ImportError(f"no entry points in group '{POLICY_GROUP}': graphc's installed metadata is out of "
                          "date; reinstall it (`pip install --no-deps -e .`)")
    return found


def __getattr__(name: str):
    if name == "BUILTIN_POLICIES":  # read on first use: scanning the installed metadata takes ~0.1 s
        return builtin_policies()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_POLICIES: dict[str, type] = {}


class PolicyLike(Protocol):
    """What the compiler calls on a policy (runtime/cache/base.py's CachePolicy implements it).

    Class level (validation, binding): `name`, `check_params(params) -> [problem]`,
    `check_layer(layer_info) -> problem | None`, `cls(layer_info, **params)`.
    Instance level: `new_cache()` (a layer cache speaking mlx-lm's cache protocol; one whose
    class says `batch_prefill = True` accepts several left-padded prompts in one forward),
    `describe()`, `bytes_per_token()`, `chain_safe`, `lossy_tolerance` (the self-check's
    allowance for policies that change the numbers on purpose), and for prefix sharing the
    prefix protocol: `prefix_kind`, `prefix_unsupported()`, `prefix_tail()` (runtime/cache/base.py).
    Optional: `for_target(target)`, called by bind() with the device's facts (compiler/target.py)
    where a policy's caches run differently by device (`quantized`: graphc's CUDA kernel).
    """

    name: ClassVar[str]
    chain_safe: ClassVar[bool]
    lossy_tolerance: ClassVar[float]

    def new_cache(self) -> Any: ...

    def describe(self) -> str: ...

    def bytes_per_token(self) -> int: ...


def register_policy(name: str):
    """Class decorator: make a policy class available to graphs under `name`."""

    def deco(cls):
        home = builtin_policies().get(name)
        if home is not None and cls.__module__ != home:
            raise ValueError(f"cache policy name '{name}' is a built-in one ({home}); register yours under "
                             "another name")
        if name in _POLICIES and _POLICIES[name] is not cls:
            raise ValueError(f"cache policy '{name}' is already registered by {_POLICIES[name].__qualname__}")
        cls.name = name
        _POLICIES[name] = cls
        return cls

    return deco


def get_policy(name: str) -> type:
    """The class registered under `name` (a built-in one is imported on first use). KeyError if none."""
    if name not in _POLICIES and name in builtin_policies():
        provider(POLICY_GROUP, name, f"the built-in cache policy '{name}'")
    try:
        return _POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown cache policy '{name}' (registered: {', '.join(policy_names())})") from None


def policy_names() -> list[str]:
    """Every name a graph may use: the built-ins and whatever plugins registered so far."""
    return sorted(set(_POLICIES) | set(builtin_policies()))


def prefix_unsupported_reason(policies) -> str | None:
    """Why these layer policies cannot share prefixes (None when they can).

    A rule over the prefix protocol every policy speaks (runtime/cache/base.py,
    runtime/cache/prefix_state.py): each policy's own `prefix_unsupported()` reason, then what
    the cache needs (a layer with per-token state to index by, one window size). Read by the
    plan (a note `graphc inspect` shows) and by the runtime's prefix cache, which is built only
    when this is None. Kinds compare by value ("tokens" / "tail" / "snapshot")."""
    for i, p in enumerate(policies):
        why = p.prefix_unsupported()
        if why:
            return f"layer {i}'s {why}" if why.startswith("policy ") else f"layer {i}: {why}"
    kinds = [str(getattr(p.prefix_kind, "value", p.prefix_kind)) for p in policies]
    if "tokens" not in kinds:
        return "no layer keeps per-token prefix state (prefix_kind tokens) to index prefixes by"
    tails = {p.prefix_tail() for p, k in zip(policies, kinds) if k == "tail"}
    if len(tails) > 1:
        return f"sliding layers of different windows {sorted(tails)}: one window pool serves one window size"
    return None


def rollback_problem(binding) -> str | None:
    """Can this bound model speculate? None when every layer's cache has `trim_rows` (it can drop
    rejected draft positions per row); else why speculation is off for this model. Read by the
    `verify` op's inspect line and by the runtime's speculator (runtime/speculative/)."""
    if not binding.batched:
        return "the model runs one request at a time on mlx-lm's own caches (no per-row rollback)"
    for layer, pol in zip(binding.layers, binding.policies):
        cache = pol.new_cache()
        if not callable(getattr(cache, "trim_rows", None)):
            return (f"layer {layer.index} ({layer.kind}) uses cache policy '{pol.name}', which cannot remove "
                    "rejected draft positions (windowed ring buffers and recurrent state keep no undo)")
    return None
