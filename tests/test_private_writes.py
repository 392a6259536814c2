"""No runtime module writes another object's private fields.

A component that assigns `other._field = ...` couples itself to how `other` keeps its state:
the owner can no longer change that state without breaking a caller it cannot see (the
fault guard once wrote the scheduler's burst counter, the engine handed decode rows to the
runner through a field of its own). Components exchange values and call public methods
instead (docs/architecture.md, "A request's walk").

An AST scan of every module in runtime/: an assignment, augmented assignment, annotated
assignment, `del`, or `setattr(x, "_name", ...)` whose target is an underscore attribute of
anything but `self` (or `cls`) fails, naming the file and line. Dunder attributes
(`__doc__`, `__name__`) are Python's own protocol and allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWN = {"self", "cls"}


def _private(attr: str) -> bool:
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


def _targets(node) -> list:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [node.target]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [node.optional_vars]
    return []


def _flatten(target) -> list:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for e in target.elts for t in _flatten(e)]
    if isinstance(target, ast.Starred):
        return _flatten(target.value)
    return [target]


def _foreign(target) -> str | None:
    """`obj._name` for an attribute target whose object is not self/cls, else None."""
    if not isinstance(target, ast.Attribute) or not _private(target.attr):
        return None
    if isinstance(target.value, ast.Name) and target.value.id in OWN:
        return None
    return f"{ast.unparse(target.value)}.{target.attr}"


def foreign_private_writes(source: str, filename: str = "<src>") -> list[tuple[int, str]]:
    """(line, `obj._name`) of every write to another object's private attribute."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        for target in _targets(node):
            for t in _flatten(target):
                name = _foreign(t)
                if name is not None:
                    out.append((t.lineno, name))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
            obj = node.args[0]
            if not (isinstance(obj, ast.Name) and obj.id in OWN):
                out.append((node.lineno, f"{ast.unparse(obj)}.{node.args[1].value}"))
    return sorted(out)


def test_no_runtime_module_writes_another_objects_private_fields():
    found = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        rel = path.relative_to(ROOT)
        found += [f"{rel}:{line}: writes {name}" for line, name in foreign_private_writes(path.read_text(), str(rel))]
    assert not found, ("runtime modules write other objects' private fields (call a public method of the "
                       "owner or pass a value instead):\n" + "\n".join(found))


def test_the_scan_sees_every_kind_of_write():
    src = """
def f(sched, runner, pairs):
    sched._burst_left = 0
    sched._burst_left += 1
    a, runner._batch = pairs
    sched.waiting._items: list = []
    del runner._held
    setattr(sched, "_flag", True)
    for runner._row in pairs:
        pass
"""
    names = [n for _, n in foreign_private_writes(src)]
    assert names == ["sched._burst_left", "sched._burst_left", "runner._batch", "sched.waiting._items",
                     "runner._held", "sched._flag", "runner._row"]


def test_the_scan_allows_own_fields_public_fields_and_dunders():
    src = """
class A:
    def f(self, other):
        self._x = 1
        self._x, self._y = 2, 3
        other.public = 4
        other.__doc__ = "ok"
        setattr(self, "_z", 5)

    @classmethod
    def g(cls):
        cls._registry = {}
"""
    assert foreign_private_writes(src) == []
