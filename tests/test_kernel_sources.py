"""The kernels' CUDA lives in runtime/kernels/cuda/*.cu (package data), not in Python strings.

The modules read their sources with `cuda_source`; what they build is checked by
tests/test_kernel_builds.py (NVRTC, no GPU needed). Here: every file is shipped and used,
and no kernel module holds CUDA of its own beyond one-to-three-line fragments.
"""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from pathlib import Path

from graphc.runtime import kernels
from graphc.runtime.kernels import cuda_source

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "runtime" / "kernels"


def cuda_files() -> list[str]:
    return sorted(str(p.relative_to(KERNELS / "cuda")) for p in (KERNELS / "cuda").rglob("*.cu"))


def test_every_cuda_file_is_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data["graphc.runtime.kernels"]
    assert cuda_files()
    for name in cuda_files():
        assert any(fnmatch.fnmatch(f"cuda/{name}", g) for g in globs), name


def test_every_cuda_file_is_read_by_its_module():
    named = set()
    for path in KERNELS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "cuda_source"
                    and isinstance(node.args[0], ast.Constant)):
                named.add(node.args[0].value)
                # a module reads its own folder (decode_attention_cuda.py assembles decode_attention's)
                assert node.args[0].value.split("/")[0] == path.stem.removesuffix("_cuda")
    assert named == set(cuda_files())


def test_cuda_source_reads_the_file_as_is():
    name = cuda_files()[0]
    assert cuda_source(name) == (KERNELS / "cuda" / name).read_text()
    assert Path(kernels.__file__).parent == KERNELS


def test_no_kernel_module_keeps_cuda_in_a_long_string():
    for path in KERNELS.glob("*.py"):
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                assert node.value.count("\n") < 4, f"{path.name}:{node.lineno}: CUDA belongs in cuda/{path.stem}/"
