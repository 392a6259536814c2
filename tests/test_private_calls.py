"""No module of the package reads, calls or writes another object's private attributes.

tests/test_private_writes.py keeps components from writing each other's state; this keeps
them from reading it or calling its private methods, which couples a caller just as tightly
to how the owner works inside (fault recovery once called the engine's `_step`, `_delta` and
`_preempt`; the distributed loader its leader's `_start_group`). Components exchange values
and call public, documented methods instead (docs/architecture.md, "A request's walk").

The rules, an AST scan of every .py file under contracts/, compiler/, runtime/, cli/ and
benchmarks/:

- `x._name` (load, store or del; `_name` has a leading underscore and is not a dunder) fails
  unless `x` is the name `self` or `cls`, or a `super()` call: an object's own privates,
  its inherited ones included. Everything else fails: another object (`eng._step()`), another
  module (`compiled_decode._on_cuda()`), a class from outside (`Engine._step`), a chain
  (`self.runner._launch`: the runner's private, not self's).
- `getattr` / `hasattr` / `setattr` / `delattr` with a constant private name on anything but
  `self` / `cls` is the same access spelled as a string, and fails the same way.
- A module's own private names (`_helper()`, `_TABLE`) are plain names, never attributes, so
  they are not touched by the rule.
- `from graphc.x import _y` / `from .x import _y` (an ImportFrom of a private, non-dunder name
  from another module of graphc, relative imports resolved against the file's own module) is
  the same reach-in done at import time, and fails the same way: a name two modules share is
  public (no underscore, documented) in the module it belongs to. Imports from outside graphc
  (mlx-lm's `_get_classes`) are out of scope of this check: we cannot make their names public.

Exceptions are listed below one by one, each with its reason; an entry that no longer occurs
fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("contracts", "compiler", "runtime", "cli", "benchmarks")
OWN = {"self", "cls"}
ATTR_FUNCS = {"getattr", "hasattr", "setattr", "delattr"}

# Allowed in any file: names that are documented public API despite their underscore.
ANYWHERE = {
    "os._exit": "the os module's documented exit without cleanup (a failed rank or watchdog ends "
                "the process while other threads hang in a collective)",
}

# Allowed in one file: (path, `object._name` as the source spells the object).
IN_FILE = {
    # mlx-lm's TokenizerWrapper (mlx_lm/tokenizer_utils.py) keeps the Hugging Face tokenizer in
    # `_tokenizer` and offers no public handle to it; its __getattr__ forwards attributes, but
    # len(), calling it for offsets and llguidance's tokenizer import need the object itself.
    ("runtime/text.py", "tokenizer._tokenizer"): "the HF tokenizer's byte-level vocabulary",
    ("runtime/grammar/matcher.py", "tokenizer._tokenizer"): "llguidance builds its tokenizer from the HF one",
    ("runtime/server/message_bounds.py", "tok._tokenizer"): "character offsets from the HF fast tokenizer",
    ("runtime/server/prefix_tokens.py", "tokenizer._tokenizer"): "character offsets from the HF fast tokenizer",
    # TokenizerWrapper's `_chat_template` is set when mlx-lm renders the template itself (no HF
    # template); then the HF offsets do not describe its text. No public attribute says so.
    ("runtime/server/message_bounds.py", "tok._chat_template"): "mlx-lm's own chat template in use",
    ("benchmarks/contestants.py", "tokenizer._tokenizer"): "a TokenizerWrapper (real text) or a bare id tokenizer",
    # mlx-lm's BatchGenerator exposes no public view of its decode batch's caches; the KV
    # capacity bench measures exactly those.
    ("benchmarks/kv_capacity.py", "gen._generation_batch"): "BatchGenerator's decode-batch KV, measured",
    # The lab measures and builds the product's internals on purpose, and no product module may
    # import it (tests/test_imports.py). Each reach-in:
    ("benchmarks/step_profile.py", "runner._launch"): "the step profiler wraps the runner's launch to time it",
    ("benchmarks/step_profile.py", "engine.runner._launch"): "and removes its wrapper afterwards",
    ("benchmarks/step_timeline.py", "sched._burst_left"): "the timeline marks steps inside an admission burst",
    ("benchmarks/kernel_builds.py", "sk._check_cases"): "the offline build compiles the shapes the check runs",
    ("benchmarks/kernel_builds.py", "tr._VARIANTS"): "the offline build compiles every top-ranks variant",
    ("benchmarks/probes/top_ranks.py", "top_ranks._VARIANTS"): "the probe compares every variant with MLX",
    ("benchmarks/probes/top_ranks.py", "top_ranks._compare"): "with the kernel's own comparison",
}


def _private(attr: str) -> bool:
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


def _own(obj) -> bool:
    if isinstance(obj, ast.Name):
        return obj.id in OWN
    return isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id == "super"


def foreign_private_access(source: str, filename: str = "<src>") -> list[tuple[int, str]]:
    """(line, `obj._name`) of every read, call or write of another object's private attribute."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            out.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTR_FUNCS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value)
              and not _own(node.args[0])):
            out.append((node.lineno, f"{ast.unparse(node.args[0])}.{node.args[1].value}"))
    return sorted(out)


def module_name(rel: str) -> str:
    """The dotted module of a scanned file (pyproject maps graphc.<top> onto <top>/):
    compiler/modelgen/demo.py -> graphc.compiler.modelgen.demo; a package's __init__.py -> the package."""
    parts = ["graphc", *rel.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def foreign_private_imports(source: str, filename: str = "<src>", module: str = "graphc.pkg.mod",
                            is_package: bool = False) -> list[tuple[int, str]]:
    """(line, `source_module._name`) of every private name `module` imports from another graphc module."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.ImportFrom):
            continue
        origin = _imported_from(node, module, is_package)
        if origin != module and (origin == "graphc" or origin.startswith("graphc.")):
            out += [(node.lineno, f"{origin}.{a.name}") for a in node.names if _private(a.name)]
    return sorted(out)


def _files():
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path, path.relative_to(ROOT).as_posix()


def _scan() -> list[tuple[str, int, str]]:
    found = []
    for path, rel in _files():
        found += [(rel, line, name) for line, name in foreign_private_access(path.read_text(), rel)]
    return found


def test_no_module_reads_or_calls_another_objects_privates():
    bad = [f"{rel}:{line}: {name}" for rel, line, name in _scan()
           if name not in ANYWHERE and (rel, name) not in IN_FILE]
    assert not bad, ("modules reach into other objects' private attributes (give the owner a public, documented "
                     "method or pass a value instead; an exception needs its reason in this test's lists):\n"
                     + "\n".join(bad))


def test_no_module_imports_another_modules_privates():
    bad = [f"{rel}:{line}: {name}" for path, rel in _files()
           for line, name in foreign_private_imports(path.read_text(), rel, module_name(rel), path.name == "__init__.py")]
    assert not bad, ("modules import other modules' private names (make the shared name public in the module "
                     "it belongs to, or move it there):\n" + "\n".join(bad))


def test_every_exception_is_still_needed():
    seen = {(rel, name) for rel, _, name in _scan()}
    stale = sorted(k for k in IN_FILE if k not in seen)
    stale += sorted(n for n in ANYWHERE if not any(name == n for _, name in seen))
    assert not stale, f"exceptions that no longer occur (remove them): {stale}"


def test_the_scan_sees_reads_calls_writes_and_strings():
    src = """
import os
from . import compiled_decode

def f(eng, engine, Engine, x):
    eng._step()
    outs = [eng._delta(r) for r in x]
    if engine._closed:
        engine.runner._launch = None
    compiled_decode._on_cuda()
    Engine._step(eng)
    getattr(x, "_hidden", None)
    hasattr(x, "_flag")
    del x._held
    os._exit(1)
    self.runner._busy()
"""
    names = [n for _, n in foreign_private_access(src)]
    assert names == ["eng._step", "eng._delta", "engine._closed", "engine.runner._launch",
                     "compiled_decode._on_cuda", "Engine._step", "x._hidden", "x._flag", "x._held", "os._exit",
                     "self.runner._busy"]


def test_the_scan_allows_own_and_inherited_privates_public_names_and_dunders():
    src = """
_TABLE = {}

def _helper():
    return _TABLE

class A(B):
    def f(self, other):
        self._x = self._y + _helper()["k"]
        super()._setup()
        getattr(self, "_z", None)
        other.public()
        other.__class__.__name__

    @classmethod
    def g(cls):
        return cls._registry
"""
    assert foreign_private_access(src) == []


def test_the_import_scan_resolves_relative_imports_and_skips_outside_and_own_names():
    src = """
from .select import _ids_from_keys, rank_keys
from ..cache.full import _batch_rank as rank
from . import _helpers
from graphc.runtime.compiled_decode import _write_columns
from graphc.runtime.sampling.fused import _own_name
from mlx_lm.utils import _get_classes
from .select import __all__
from __future__ import annotations
"""
    names = [n for _, n in foreign_private_imports(src, module="graphc.runtime.sampling.fused")]
    assert names == ["graphc.runtime.sampling.select._ids_from_keys", "graphc.runtime.cache.full._batch_rank",
                     "graphc.runtime.sampling._helpers", "graphc.runtime.compiled_decode._write_columns"]
    # In a package's __init__.py, `.` is the package itself: its own names are not foreign.
    pkg = "from . import _own\nfrom .fused import _theirs\n"
    assert [n for _, n in foreign_private_imports(pkg, module="graphc.runtime.sampling", is_package=True)] == [
        "graphc.runtime.sampling.fused._theirs"]
    assert module_name("compiler/modelgen/demo.py") == "graphc.compiler.modelgen.demo"
    assert module_name("runtime/sampling/__init__.py") == "graphc.runtime.sampling"
