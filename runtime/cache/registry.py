"""Cache policies are registered by name; a graph's `cache:` section names them per layer type.

A user adds a policy with a class and a YAML line:

    @register_policy("my_policy")
    class MyPolicy(CachePolicy): ...

and in the graph: `cache: {full_attention: {policy: my_policy}}`.
"""

from __future__ import annotations

_POLICIES: dict[str, type] = {}


def register_policy(name: str):
    def deco(cls):
        if name in _POLICIES and _POLICIES[name] is not cls:
            raise ValueError(f"cache policy '{name}' is already registered by {_POLICIES[name].__qualname__}")
        cls.name = name
        _POLICIES[name] = cls
        return cls

    return deco


def get_policy(name: str) -> type:
    _load_builtins()
    try:
        return _POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown cache policy '{name}' (registered: {', '.join(sorted(_POLICIES))})") from None


def policy_names() -> list[str]:
    _load_builtins()
    return sorted(_POLICIES)


def _load_builtins():
    # Importing the built-in policy modules registers them.
    from . import cache_list, full, native, pool_backed, ssm_state, windowed  # noqa: F401
