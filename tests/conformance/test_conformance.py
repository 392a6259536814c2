"""Every mlx-lm model type: served exactly by graphc, or refused with a reason -- never wrong.

Default run: the FAST subset (tiny_configs.FAST). The whole sweep: ``pytest -m slow
tests/conformance``. ``GRAPHC_SWEEP_STATUS=path`` writes each type's outcome to a markdown file;
``python tests/conformance/models_table.py --write docs/models.md`` regenerates the docs table.
See sweep.py for what is compared and how outcomes are classified.
"""

from __future__ import annotations

import pytest

from expectations import REFUSED
from models_table import mlx_lm_model_types
from sweep import Outcome, run_model
from tiny_configs import CONFIGS, EXCLUDED, FAST

ALL_TYPES = mlx_lm_model_types()


def check(outcome) -> None:
    if outcome.status == "excluded":
        pytest.skip(f"{outcome.model_type} excluded: {outcome.detail}")
    if outcome.status == "FAIL":
        pytest.fail(f"{outcome.model_type}: {outcome.detail}", pytrace=False)
    if outcome.status == "refused":
        assert outcome.model_type in REFUSED, (
            f"{outcome.model_type} is refused but expectations.REFUSED does not allow it: {outcome.detail}")
        assert outcome.model_type in outcome.detail, (
            f"the refusal of {outcome.model_type} does not name the model type: {outcome.detail}")
    else:
        assert outcome.status == "exact", outcome


def test_every_mlx_lm_model_type_has_a_config_or_a_documented_exclusion():
    missing = [t for t in ALL_TYPES if t not in CONFIGS and t not in EXCLUDED]
    assert not missing, (
        f"mlx-lm ships model types the sweep has no tiny config for: {missing}; add one to "
        "tests/conformance/tiny_configs.py (or an EXCLUDED entry saying why it cannot run)")
    stale = sorted(set(CONFIGS) - set(ALL_TYPES))
    assert not stale, f"tiny_configs.py has configs for types mlx-lm no longer ships: {stale}"
    assert set(FAST) <= set(CONFIGS) and not set(FAST) & set(EXCLUDED)


def test_harness_catches_a_model_that_is_not_the_reference(tiny_model):
    """graphc serving seed-0 weights against mlx-lm's seed-1 model must be a FAIL, not exact."""
    out = run_model("llama", tiny_model("llama"), reference_folder=tiny_model("llama", seed=1))
    assert out.status == "FAIL" and "tokens differ" in out.detail, out


@pytest.mark.parametrize("model_type", FAST)
def test_fast_subset(model_type, tiny_model, record_outcome):
    out = run_model(model_type, tiny_model(model_type))
    record_outcome(out)
    check(out)


def test_a_model_whose_own_output_depends_on_chunking_is_refused(tiny_model):
    # plamo3 (tiny_configs.NOTES): mlx-lm's answer changes with the prefill chunk, so serving it on
    # its own caches would match one chunking and not the other; the load-time check refuses it.
    out = run_model("plamo3", tiny_model("plamo3"))
    assert out.status == "refused", out
    assert "prefilled whole and in" in out.detail and "plamo3" in out.detail, out.detail


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_sweep(model_type, tiny_model, record_outcome):
    if model_type in EXCLUDED:  # some have no config at all (nothing to build)
        record_outcome(Outcome(model_type, "excluded", EXCLUDED[model_type]))
        pytest.skip(f"{model_type} excluded: {EXCLUDED[model_type]}")
    out = run_model(model_type, tiny_model(model_type))
    record_outcome(out)
    check(out)
