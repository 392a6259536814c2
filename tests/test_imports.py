"""The layering holds for every import: contracts <- compiler <- runtime, with the CLI on top.

    graphc.contracts   imports no other graphc package
    graphc.compiler    imports graphc.contracts only (never graphc.runtime or graphc.cli)
    graphc.runtime     imports graphc.compiler and graphc.contracts (never graphc.cli)
    graphc.benchmarks  the lab (top-level benchmarks/): may import the three above, never the CLI;
                       nothing in the product imports it except the CLI's `bench` command
    graphc.cli         the composition root: may import all of them

Checked four ways: an AST scan of every import statement (function-local ones included,
and `importlib.import_module` / `__import__` of a literal name), the package-level import
graph (networkx: no cycle), the module-level import graph (no cycle either, with string
imports as edges: a literal naming a graphc module, or "module:attr", is code loaded by
name; imports under `if TYPE_CHECKING:` are annotations and never run), and a fresh
interpreter importing compiler modules.

Imports sit at module top. A function-local import hides an edge from the reader (and
used to hide circles), so the only ones allowed are of optional dependencies: the
distributions behind pyproject's extras that are not required, e.g. fastapi or matplotlib,
which `graphc --help` must not need.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
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


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` names, relative levels resolved against `package`."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_names(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, wherever it sits."""
    mod = module_name(path, root)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = _absolute(node, package)
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


# ---- the module import graph: every import statement and string import, wherever it sits ----

MODULE_FOLDERS = (*PACKAGES, "graphs")
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def package_modules(root: Path) -> dict[str, Path]:
    """graphc module name -> its file, for every module of the package folders."""
    return {module_name(path, root): path
            for folder in MODULE_FOLDERS if (root / folder).is_dir()
            for path in sorted((root / folder).rglob("*.py"))}


def _function_scoped(tree: ast.AST) -> set[int]:
    """ids of the nodes that run only when a function is called (not at import)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside |= {id(n) for n in ast.walk(node) if n is not node}
    return inside


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: names for annotations, never imported when run."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for child in node.body for n in ast.walk(child)}
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}


def _string_import(node: ast.AST) -> str | None:
    """The literal module of importlib.import_module("m") / __import__("m"), else None."""
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                 or (isinstance(node.func, ast.Name) and node.func.id in ("__import__", "import_module")))):
        return node.args[0].value
    return None


def module_imports(path: Path, root: Path, modules: dict[str, Path]) -> list[tuple[int, str, bool]]:
    """(line, imported module, function-local?) for each import in the file.

    `from a import b` names a.b when that is a module of the package, else a. A string constant
    that is a graphc module's name (or "module:attr") is an import: something loads it by name.
    """
    mod = module_name(path, root)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    local, docs = _function_scoped(tree), _docstrings(tree)
    docs |= {id(n.args[0]) for n in ast.walk(tree) if _string_import(n) is not None}  # counted once, as the call
    # `[sys.executable, "-m", "graphc.cli", ...]` starts a process; it imports nothing here
    docs |= {id(b) for n in ast.walk(tree) if isinstance(n, (ast.List, ast.Tuple))
             for a, b in zip(n.elts, n.elts[1:]) if isinstance(a, ast.Constant) and a.value == "-m"}
    skip = _type_checking_only(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        is_local = id(node) in local
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, is_local) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = _absolute(node, package)
            subs = [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in modules]
            out += [(node.lineno, s, is_local) for s in subs]
            if len(subs) < len(node.names):
                out.append((node.lineno, name, is_local))
        elif (named := _string_import(node)) is not None:
            out.append((node.lineno, named, is_local))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
              and node.value.partition(":")[0] in modules):
            out.append((node.lineno, node.value.partition(":")[0], is_local))
    return out


def module_graph(root: Path) -> nx.DiGraph:
    """graphc module -> graphc module it imports; each edge keeps "file:line" of its imports."""
    modules = package_modules(root)
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for mod, path in modules.items():
        for line, name, _ in module_imports(path, root, modules):
            target = name
            while target and target not in modules:  # `import graphc.a.b.attr` -> the module graphc.a.b
                target = target.rpartition(".")[0]
            if target and target != mod:
                g.add_edge(mod, target)
                g.edges[mod, target].setdefault("where", []).append(f"{path.relative_to(root)}:{line}")
    return g


def module_cycles(root: Path) -> list[str]:
    """One line per elementary circle: the modules, and where each hop imports the next."""
    g = module_graph(root)
    out = []
    for cycle in nx.simple_cycles(g):
        hops = [f"{a} ({g.edges[a, b]['where'][0]})" for a, b in zip(cycle, cycle[1:] + cycle[:1])]
        out.append(" -> ".join(hops))
    return sorted(out)


def _distribution_names(requirements: list[str]) -> set[str]:
    return {_REQUIREMENT_NAME.match(r).group(1).lower().replace("_", "-") for r in requirements}


def optional_imports(root: Path) -> set[str]:
    """Top-level import names of the distributions only pyproject's extras bring in."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    required = _distribution_names(project["dependencies"])
    optional = set().union(*map(_distribution_names, project["optional-dependencies"].values())) - required
    # a distribution's import names from its installed metadata; one not installed is its own name
    names = {dist.lower().replace("_", "-") for dist in optional}
    by_dist: dict[str, set[str]] = {}
    for top, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            by_dist.setdefault(dist.lower().replace("_", "-"), set()).add(top)
    out = set()
    for dist in names:
        out |= by_dist.get(dist, {dist.replace("-", "_")})
    return out


def function_local_imports(root: Path) -> list[str]:
    """"file:line imports name" of each import inside a function that is not an optional dependency."""
    modules, allowed = package_modules(root), optional_imports(root)
    out = []
    for path in modules.values():
        for line, name, is_local in module_imports(path, root, modules):
            if is_local and name.split(".")[0] not in allowed:
                out.append(f"{path.relative_to(root)}:{line} imports {name}")
    return out


def test_the_module_import_graph_has_no_cycle():
    cycles = module_cycles(ROOT)
    assert not cycles, f"{len(cycles)} import circles:\n" + "\n".join(cycles)
    g = module_graph(ROOT)
    # the scan built the real graph: the engine reaches the compiler, the CLI the runtime
    assert nx.has_path(g, "graphc.runtime.engine", "graphc.compiler.compile")
    assert nx.has_path(g, "graphc.cli.main", "graphc.runtime.engine")


def test_imports_sit_at_module_top_except_optional_dependencies():
    bad = function_local_imports(ROOT)
    assert not bad, f"{len(bad)} function-local imports (hoist them to module top):\n" + "\n".join(bad)


def test_optional_dependencies_come_from_the_extras():
    allowed = optional_imports(ROOT)
    assert {"fastapi", "uvicorn", "matplotlib", "openai", "gguf"} <= allowed
    assert not allowed & {"mlx", "mlx_lm", "numpy", "networkx", "attrs", "jinja2", "yaml", "llguidance"}


def test_the_module_scan_sees_local_string_and_relative_imports(tmp_path):
    (tmp_path / "contracts").mkdir()
    (tmp_path / "runtime").mkdir()
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "contracts" / "__init__.py").write_text("")
    (tmp_path / "contracts" / "a.py").write_text(
        '"""graphc.runtime.b is named in a docstring only."""\n'
        "PROVIDER = 'graphc.runtime.b:make'\n"
        "def f():\n    import numpy\n    import fastapi\n")
    (tmp_path / "runtime" / "__init__.py").write_text("")
    (tmp_path / "runtime" / "b.py").write_text(
        "import importlib\nfrom ..contracts import a\n"
        "def g():\n    importlib.import_module('graphc.runtime')\n")
    g = module_graph(tmp_path)
    assert set(g.edges) == {("graphc.contracts.a", "graphc.runtime.b"), ("graphc.runtime.b", "graphc.contracts.a"),
                            ("graphc.runtime.b", "graphc.runtime")}
    assert len(module_cycles(tmp_path)) == 1
    assert function_local_imports(tmp_path) == ["contracts/a.py:4 imports numpy",
                                                "runtime/b.py:4 imports graphc.runtime"]


# ---- the kernels are leaves: token_math (pure mx: murmur, noise, rank keys, filters, Gumbel-max)
# imports no graphc module outside itself; a kernel may import it, never the sampler (which
# dispatches to the kernels) nor the model adapters (compiler/archs.py's ArchAdapter).
TOKEN_MATH = "graphc.runtime.token_math"
KERNELS = "graphc.runtime.kernels"
NOT_FROM_KERNELS = ("graphc.runtime.sampling", "graphc.compiler.archs")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def kernel_imports_of_the_sampler(root: Path) -> list[str]:
    """Each import (string ones included) a kernel makes of the sampler or the adapters, and each
    sampler module a kernel reaches through other modules' imports."""
    g = module_graph(root)
    out = []
    for mod in (m for m in g if _within(m, KERNELS)):
        for target in g.successors(mod):
            if any(_within(target, p) for p in NOT_FROM_KERNELS) or "adapter" in target.rpartition(".")[2]:
                out.append(f"{mod} -> {target} ({g.edges[mod, target]['where'][0]})")
        out += [f"{mod} reaches {t}" for t in sorted(nx.descendants(g, mod))
                if _within(t, "graphc.runtime.sampling") and t not in g.successors(mod)]
    return sorted(out)


def token_math_imports(root: Path) -> list[str]:
    """"module -> target (file:line)" for each graphc module outside token_math that it imports."""
    g = module_graph(root)
    return sorted(f"{a} -> {b} ({g.edges[a, b]['where'][0]})" for a, b in g.edges
                  if _within(a, TOKEN_MATH) and not _within(b, TOKEN_MATH))


def test_no_kernel_imports_the_sampler_or_the_adapters():
    assert kernel_imports_of_the_sampler(ROOT) == []
    assert token_math_imports(ROOT) == []
    g = module_graph(ROOT)  # the scan saw the real edges: the kernels do use the token math
    assert g.has_edge("graphc.runtime.kernels.top_ranks", "graphc.runtime.token_math.ranks")
    assert g.has_edge("graphc.runtime.kernels.gumbel_choose", "graphc.runtime.token_math.choose")


def test_the_kernel_scan_sees_string_and_function_local_imports(tmp_path):
    for folder in ("runtime", "runtime/kernels", "runtime/sampling", "runtime/token_math"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    # k names the sampler by string, in and outside a function; j reaches it through token_math
    (tmp_path / "runtime" / "sampling" / "select.py").write_text("")
    (tmp_path / "runtime" / "token_math" / "ranks.py").write_text("X = 'graphc.runtime.kernels.k'\n")
    (tmp_path / "runtime" / "kernels" / "k.py").write_text(
        "import importlib\nREF = 'graphc.runtime.sampling.select:choose'\n"
        "def f():\n    importlib.import_module('graphc.runtime.sampling')\n")
    (tmp_path / "runtime" / "kernels" / "j.py").write_text("from ..token_math import ranks\n")
    assert kernel_imports_of_the_sampler(tmp_path) == [
        "graphc.runtime.kernels.j reaches graphc.runtime.sampling",
        "graphc.runtime.kernels.j reaches graphc.runtime.sampling.select",
        "graphc.runtime.kernels.k -> graphc.runtime.sampling (runtime/kernels/k.py:4)",
        "graphc.runtime.kernels.k -> graphc.runtime.sampling.select (runtime/kernels/k.py:2)"]
    assert token_math_imports(tmp_path) == [
        "graphc.runtime.token_math.ranks -> graphc.runtime.kernels.k (runtime/token_math/ranks.py:1)"]
