"""Fixtures of the conformance sweep: tiny model folders built once per session, and optional
reports of the run: GRAPHC_SWEEP_STATUS=path writes every outcome there (markdown, failures
first); GRAPHC_SWEEP_TABLE=path writes the supported-models table (docs/supported-models.md)."""

from __future__ import annotations

import os

import pytest

from tiny_models import build_model_folder

_OUTCOMES: list = []


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """tiny_model(model_type, seed=0) -> folder; each is built once per session."""
    made = {}

    def get(model_type: str, seed: int = 0):
        key = (model_type, seed)
        if key not in made:
            made[key] = build_model_folder(model_type, tmp_path_factory.mktemp(f"tiny-{model_type}-{seed}"), seed=seed)
        return made[key]

    return get


@pytest.fixture(scope="session")
def record_outcome():
    return _OUTCOMES.append


def pytest_sessionfinish(session, exitstatus):
    if not _OUTCOMES:
        return
    from models_table import status_text, table_text

    path = os.environ.get("GRAPHC_SWEEP_STATUS")
    if path:
        label = os.environ.get("GRAPHC_SWEEP_LABEL", "pytest run")
        with open(path, "w", encoding="utf-8") as f:
            f.write(status_text(_OUTCOMES, label))
    path = os.environ.get("GRAPHC_SWEEP_TABLE")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(table_text(_OUTCOMES))
