"""Shared fixtures: tiny random-weight models built once per test session with graphc make-model."""

from __future__ import annotations

import pytest

from graphc.compiler.modelgen import make_model


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """model_dir(arch, **sizes) -> folder; each distinct request is built once per session."""
    made = {}

    def get(arch: str, **kw):
        key = (arch, tuple(sorted(kw.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(f"model-{arch}")
            made[key] = make_model(arch, out, **kw)
        return made[key]

    return get
