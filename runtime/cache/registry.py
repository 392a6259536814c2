"""Cache policies are registered by name; the registry itself is a neutral contract.

It lives in graphc.contracts.policies so that the compiler (validation, binding) can look
policies up without importing the runtime; these names stay importable from here, where
plugins have always found them:

    from graphc.runtime.cache.registry import register_policy
"""

from graphc.contracts.policies import get_policy, policy_names, register_policy

__all__ = ["get_policy", "policy_names", "register_policy"]
