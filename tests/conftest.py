"""Shared fixtures: tiny random-weight models built once per test session with graphc make-model."""

from __future__ import annotations

import os

# The suites compare graphc with mlx-lm, batched with unbatched and compiled with eager bit for bit,
# which needs a BLAS whose answer for a row does not depend on the matrix's other rows. The mlx-cpu
# wheel's reference BLAS is such a one; OpenBLAS picks its kernels by shape (two of these tests
# differed in the 7th digit with it), like cuBLAS on a GPU. So the tests keep the wheel's BLAS
# (before graphc is imported: contracts/cpu_blas.py), inherited by the servers they start;
# tests/test_cpu_blas.py runs the default, OpenBLAS, in subprocesses.
os.environ.setdefault("GRAPHC_BLAS", "mlx")

import pytest  # noqa: E402

from graphc.compiler.modelgen import make_model  # noqa: E402

# Every engine the tests build runs the load-time self-check, never a stored verdict
# (compiler/selfcheck_cache.py): tests swap fast paths and policies in-process under the same
# model folder, which no verdict key sees. Set in os.environ so that servers the tests start
# as subprocesses inherit it; tests/test_selfcheck_cache.py turns the cache on explicitly.
os.environ["GRAPHC_SELFCHECK"] = "always"


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


# A live server per test module (module-scoped: each server test file gets its own engine,
# so one file's load cannot leak into another's). Modules that need other settings define
# their own `server` fixture, which overrides this one.
@pytest.fixture(scope="module")
def server(model_dir):
    from server_harness import live_server

    with live_server(model_dir("llama")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    """The official openai client pointed at the module's server."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(autouse=True)
def _speculation_ungated(monkeypatch):
    """Tests count verify steps: engines built in-process verify whenever a row drafts, instead of
    letting the measured gate (runtime/measured_gate.py) pick by this machine's timings.
    tests/test_spec_gate.py turns it on explicitly."""
    from graphc.runtime.speculative import speculator

    monkeypatch.setattr(speculator, "default_adaptive", lambda: False)
