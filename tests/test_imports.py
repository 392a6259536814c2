"""The layering holds for every import: contracts <- compiler <- runtime, with the CLI on top.

    graphc.contracts   imports no other graphc package
    graphc.compiler    imports graphc.contracts only (never graphc.runtime or graphc.cli)
    graphc.runtime     imports graphc.compiler and graphc.contracts (never graphc.cli)
    graphc.benchmarks  the lab (top-level benchmarks/): may import the three above, never the CLI;
                       nothing in the product imports it except the CLI's `bench` command
    graphc.cli         the composition root: may import all of them

Checked three ways: an AST scan of every import statement (function-local ones included,
and `importlib.import_module` / `__import__` of a literal name), the package-level import
graph (networkx: no cycle), and a fresh interpreter importing compiler modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contracts", "compiler", "runtime", "benchmarks", "cli")  # folders mapped to graphc.<name> (pyproject)
ALLOWED = {
    "contracts": set(),
    "compiler": {"contracts"},
    "runtime": {"compiler", "contracts"},
    "benchmarks": {"compiler", "contracts", "runtime"},
    "cli": {"compiler", "contracts", "runtime", "benchmarks"},
}


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["graphc", *parts])


def imported_names(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, wherever it sits."""
    mod = module_name(path, root)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
            # `from graphc import runtime` names the package in the alias
            if name == "graphc":
                out += [(node.lineno, f"graphc.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "__import__"))):
            out.append((node.lineno, node.args[0].value))
    return out


def package_of(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] == "graphc" and parts[1] in PACKAGES:
        return parts[1]
    return None


def import_edges(root: Path) -> list[tuple[str, str, str]]:
    """(importing package, imported package, "file:line") for every cross-package import."""
    edges = []
    for pkg in PACKAGES:
        folder = root / pkg
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.py")):
            for line, name in imported_names(path, root):
                target = package_of(name)
                if target is not None and target != pkg:
                    edges.append((pkg, target, f"{path.relative_to(root)}:{line} imports {name}"))
    return edges


def layering_violations(root: Path) -> list[str]:
    return [where for src, dst, where in import_edges(root) if dst not in ALLOWED[src]]


def package_cycles(root: Path) -> list[list[str]]:
    g = nx.DiGraph()
    g.add_nodes_from(PACKAGES)
    g.add_edges_from((src, dst) for src, dst, _ in import_edges(root))
    return list(nx.simple_cycles(g))


def test_no_import_crosses_the_layering():
    # compiler/ and contracts/ never import graphc.runtime (nor the CLI), not even inside a function.
    assert layering_violations(ROOT) == []


def test_the_package_import_graph_has_no_cycle():
    assert package_cycles(ROOT) == []
    edges = {(s, d) for s, d, _ in import_edges(ROOT)}
    # The graph is what the layering says, not an empty one the scan failed to build.
    assert {("compiler", "contracts"), ("runtime", "compiler"), ("runtime", "contracts"), ("cli", "runtime"),
            ("cli", "compiler")} <= edges


def test_the_scan_sees_function_local_and_relative_imports(tmp_path):
    # The checks above are only as good as the scan: a function-local import, a relative one
    # reaching out of the package, and an import_module of a literal name are all edges.
    (tmp_path / "compiler" / "ops").mkdir(parents=True)
    (tmp_path / "runtime").mkdir()
    (tmp_path / "compiler" / "ops" / "x.py").write_text(
        "def f():\n    from graphc.runtime.sampling import select_tokens\n"
        "def g():\n    from ...runtime import engine\n"
        "def h():\n    import importlib\n    importlib.import_module('graphc.runtime.cache.full')\n")
    (tmp_path / "runtime" / "y.py").write_text("from graphc.compiler.lower import StepInputs\n")
    bad = layering_violations(tmp_path)
    assert [b.split(" imports ")[1] for b in bad] == ["graphc.runtime.sampling", "graphc.runtime",
                                                       "graphc.runtime.cache.full"]
    assert package_cycles(tmp_path) == [["compiler", "runtime"]] or package_cycles(tmp_path) == [["runtime", "compiler"]]


MODULES = ["graphc.contracts", "graphc.contracts.step", "graphc.contracts.policies", "graphc.contracts.sampling",
           "graphc.compiler.compile", "graphc.compiler.inspect", "graphc.compiler.ops", "graphc.compiler.validate",
           "graphc.compiler.bind", "graphc.compiler.selfcheck", "graphc.compiler.plan", "graphc.compiler.lower",
           "graphc.compiler.archs", "graphc.cli"]


def test_compiler_imports_load_no_runtime_module():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = sorted(m for m in sys.modules if m.startswith('graphc.runtime'))\n"
            + "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
