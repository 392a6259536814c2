"""The neutral contracts (graphc.contracts) find the runtime's implementations they name."""

from __future__ import annotations

import pytest

from graphc.contracts import policies, sampling


@pytest.mark.parametrize("name", sorted(policies.BUILTIN_POLICIES))
def test_each_builtin_policy_is_registered_by_the_module_named_for_it(name):
    cls = policies.get_policy(name)
    assert cls.name == name and cls.__module__ == policies.BUILTIN_POLICIES[name]


def test_the_sampling_kernels_provide_what_the_head_ops_call():
    k = sampling.kernels()
    assert [f for f in sampling.FUNCTIONS if not hasattr(k, f)] == []


def test_a_builtin_name_cannot_be_taken_by_a_plugin():
    with pytest.raises(ValueError, match="'windowed' is a built-in one"):
        @policies.register_policy("windowed")
        class Mine:  # noqa: F811
            pass


def test_an_unknown_policy_lists_the_builtins():
    with pytest.raises(KeyError, match="unknown cache policy 'fulll'.*full"):
        policies.get_policy("fulll")


def test_old_import_paths_still_work():
    from graphc.compiler.lower import StepInputs
    from graphc.runtime.cache.registry import register_policy
    from graphc.runtime.prefix_cache import prefix_unsupported_reason

    from graphc.contracts.step import StepInputs as S

    assert StepInputs is S and register_policy is policies.register_policy
    assert prefix_unsupported_reason is policies.prefix_unsupported_reason
