"""Cache policies: registered by name, bound per layer by the compiler."""

from .base import CachePolicy, LayerCache, PolicyParam
from .prefix_state import PrefixKind, PrefixState
from .registry import get_policy, policy_names, register_policy

__all__ = ["CachePolicy", "LayerCache", "PolicyParam", "PrefixKind", "PrefixState", "get_policy", "policy_names", "register_policy"]
