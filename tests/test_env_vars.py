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
    "GRAPHC_CACHE": "compiler/gguf/convert.py: where converted GGUF models are cached",
    "GRAPHC_CACHE_DIR": "compiler/modelgen: where the demo model is cached",
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
