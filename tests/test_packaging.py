"""Every source folder is a listed package, so a non-editable install (the GPU machine's) has it all."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = {"compiler": "graphc.compiler", "runtime": "graphc.runtime", "graphs": "graphc.graphs"}


def test_every_package_folder_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, dirs = set(cfg["packages"]), cfg["package-dir"]
    found = set()
    for top, name in TOP.items():
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    missing = found - listed
    assert not missing, f"add to [tool.setuptools] packages and package-dir: {sorted(missing)}"
    for pkg in listed:
        # setuptools maps a subpackage through its nearest listed parent in package-dir.
        parent = max((p for p in dirs if pkg == p or pkg.startswith(p + ".")), key=len)
        folder = ROOT / dirs[parent] / Path(*pkg[len(parent):].split(".")[1:])
        assert (folder / "__init__.py").exists(), pkg
