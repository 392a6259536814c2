"""No environment variable switches what graphc computes: decode options are declared.

Behaviour (compile, fused blocks, kernels, the skinny-matmul table) is set by a graph's
`decode:` section or Engine arguments, shown by `graphc inspect`. The few GRAPHC_* variables
left only say where files go, a credential's default, a watchdog deadline, or how errors
print; each is listed here with its reason, so a new one fails this test until it is
justified (or made an option).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "GRAPHC_API_KEY": "runtime/server/cli.py: the default of `graphc serve --api-key` (a credential)",
    "GRAPHC_DIST_TIMEOUT": "runtime/distributed/watchdog.py: how long a hung rank may go unnoticed",
    "GRAPHC_DEBUG": "cli/main.py: print the traceback instead of a one-line error",
    "GRAPHC_CACHE_DIR": "compiler/cache_dir.py: where the demo model's tokenizer and converted GGUF models are cached",
    "GRAPHC_CACHE": "compiler/cache_dir.py: the old name of GRAPHC_CACHE_DIR, read with a FutureWarning",
    "GRAPHC_SELFCHECK": "compiler/selfcheck_cache.py: `always` runs the load-time self-check at every start "
                        "instead of reusing a stored verdict (what is computed is the same either way)",
    "GRAPHC_BLAS": "contracts/cpu_blas.py: which library the CPU's float32 matmuls call (`mlx`: the wheel's "
                   "reference BLAS; the same products up to rounding); chosen before mlx.core is imported, so "
                   "it cannot be an Engine option",
    # where the CUDA toolchain of the offline kernel build is found (tests and a bench script only)
    "GRAPHC_NVRTC": "benchmarks/kernel_builds.py: where libnvrtc.so is",
    "GRAPHC_CUDA_INCLUDE": "benchmarks/kernel_builds.py: where cuda_bf16.h is",
    "GRAPHC_PTXAS": "benchmarks/kernel_builds.py: where ptxas is",
}


def env_names(root: Path) -> dict[str, list[str]]:
    """Every GRAPHC_* string literal in graphc's code -> where it appears."""
    out: dict[str, list[str]] = {}
    for pkg in ("contracts", "compiler", "runtime", "cli"):
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for name in re.findall(r"^GRAPHC_[A-Z0-9_]+$", node.value):
                        out.setdefault(name, []).append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def test_only_the_listed_environment_variables_are_read():
    found = env_names(ROOT)
    assert {k: v for k, v in found.items() if k not in ALLOWED} == {}
    assert "GRAPHC_DEBUG" in found  # the scan sees them at all


def test_one_cache_variable_and_the_old_name_warns(monkeypatch, tmp_path):
    import warnings

    from graphc.compiler.cache_dir import cache_root

    monkeypatch.delenv("GRAPHC_CACHE_DIR", raising=False)
    monkeypatch.setenv("GRAPHC_CACHE", str(tmp_path / "old"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache_root() == tmp_path / "old"
    assert any(issubclass(w.category, FutureWarning) and "GRAPHC_CACHE_DIR" in str(w.message) for w in caught)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "new"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name set: no warning at all
        assert cache_root() == tmp_path / "new"
