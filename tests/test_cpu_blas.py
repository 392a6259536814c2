"""The CPU BLAS graphc loads before mlx.core on Linux (contracts/cpu_blas.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from graphc.contracts import cpu_blas


def test_choose_prefers_a_known_openblas_then_ldconfig_then_the_wheel():
    assert cpu_blas.choose({}, "linux", exists=lambda p: p == cpu_blas.KNOWN_PATHS[2],
                           find=lambda n: None) == (cpu_blas.KNOWN_PATHS[2], "OpenBLAS")
    assert cpu_blas.choose({}, "linux", exists=lambda p: False,
                           find=lambda n: "libopenblas.so.0") == ("libopenblas.so.0", "OpenBLAS")
    lib, why = cpu_blas.choose({}, "linux", exists=lambda p: False, find=lambda n: None)
    assert lib is None and "apt install libopenblas0" in why


def test_choose_obeys_graphc_blas_and_leaves_other_systems_alone():
    found = dict(exists=lambda p: True, find=lambda n: "libopenblas.so.0")
    assert cpu_blas.choose({"GRAPHC_BLAS": "mlx"}, "linux", **found)[0] is None
    assert cpu_blas.choose({"GRAPHC_BLAS": "/opt/blis/libblis.so"}, "linux", **found)[0] == "/opt/blis/libblis.so"
    assert cpu_blas.choose({}, "darwin", **found)[0] is None


PROBE = """
import ctypes, os, sys
import graphc.runtime
import numpy
from graphc.contracts import cpu_blas
maps = open("/proc/self/maps").read().split()
system = [p for p in maps if "libopenblas" in p and "scipy_openblas" not in p]
ours = ctypes.CDLL(system[0]).openblas_get_num_threads() if system else None
theirs = [p for p in maps if "scipy_openblas" in p]  # numpy's own OpenBLAS, where its wheel has one
numpys = ctypes.CDLL(theirs[0]).scipy_openblas_get_num_threads64_() if theirs else None
print("openblas" if system else "wheel", os.environ.get("OPENBLAS_NUM_THREADS"), cpu_blas.NOTE, ours, numpys, sep="|")
"""


def _probe(env: dict, first: str = "") -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHC_BLAS", "OPENBLAS_NUM_THREADS")} | env
    out = subprocess.run([sys.executable, "-c", first + PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().split("|")


needs_openblas = pytest.mark.skipif(
    not sys.platform.startswith("linux") or cpu_blas.choose(os.environ | {"GRAPHC_BLAS": "auto"}, sys.platform)[0] is None,
    reason="no system OpenBLAS here (.ci/run installs it)")


@needs_openblas
def test_importing_graphc_loads_openblas_one_thread_a_call():
    loaded, env, note, ours, numpys = _probe({})
    assert loaded == "openblas" and note.startswith("OpenBLAS") and ours == "1"
    # The variable was set for the library's load only: the process, numpy's own OpenBLAS and
    # child processes keep the user's environment (numpy's pool sized by the machine, not by graphc).
    assert env == "None"
    if numpys != "None" and (os.cpu_count() or 1) > 1:
        assert int(numpys) > 1
    loaded, env, _, ours, numpys = _probe({"OPENBLAS_NUM_THREADS": "2"})  # a user's value is used and kept
    assert env == "2" and ours == "2" and numpys in ("2", "None")


@needs_openblas
def test_graphc_blas_mlx_and_an_earlier_mlx_import_keep_the_wheels_blas():
    loaded, _, note, *_ = _probe({"GRAPHC_BLAS": "mlx"})
    assert loaded == "wheel" and "GRAPHC_BLAS=mlx" in note
    loaded, _, note, *_ = _probe({}, first="import mlx.core\n")
    assert loaded == "wheel" and "imported before graphc" in note


GREEDY = """
import sys
from graphc.runtime import Engine, SamplingParams  # first: graphc picks the BLAS before mlx.core loads
from graphc.contracts import cpu_blas
import mlx.core as mx, numpy as np
import mlx_lm
from mlx_lm.generate import generate_step
rng = np.random.default_rng(0)
a, b = rng.standard_normal((96, 200), np.float32), rng.standard_normal((200, 130), np.float32)
assert np.allclose(np.array(mx.array(a) @ mx.array(b)), a @ b, rtol=1e-5, atol=1e-4)
path, prompt = sys.argv[1], [5, 17, 33, 2, 9, 41, 8]
got = Engine.load(path).generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0].token_ids
model, _ = mlx_lm.load(path)
want = [int(t) for (t, _), _ in zip(generate_step(mx.array(prompt), model, max_tokens=12), range(12))]
print(cpu_blas.NOTE.split()[0], got == want, got, want)
"""


@needs_openblas
def test_graphc_under_openblas_matches_numpy_and_mlx_lms_greedy_tokens(model_dir):
    """What users get by default: the preloaded library's matmuls agree with numpy's, and greedy
    tokens with mlx-lm's own decode under the same library."""
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHC_BLAS", "OPENBLAS_NUM_THREADS")}
    run = subprocess.run([sys.executable, "-c", GREEDY, str(model_dir("llama"))], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[:2] == ["OpenBLAS", "True"], run.stdout
