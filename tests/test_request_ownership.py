"""One writer per Request field: the table in runtime/request.py (FIELD_OWNERS) against the source.

An AST scan of every module of the runtime package finds each write to a Request field —
`x.<field> = ...`, `x.<field> += ...`, `x.<field>[i] = ...`, `x.<field>.append(...)` (and the
other in-place list / dict methods), `setattr(x, "<field>", ...)` — on any object but `self`, and
fails when the module is not the field's owner. A module that needs to change a field it does not
own calls a method of the owner (Scheduler.advance / preempt / reset / finish, ModelRunner.forget,
Engine.fail, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from graphc.runtime.request import FIELD_OWNERS, Request

RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update", "setdefault",
            "popitem", "__setitem__", "__delitem__", "__iadd__"}


def _target_fields(node) -> list[tuple[str, ast.AST]]:
    """(field, object) for each attribute an assignment target writes, through tuples and subscripts."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return [x for elt in node.elts for x in _target_fields(elt)]
    if isinstance(node, ast.Starred):
        return _target_fields(node.value)
    if isinstance(node, ast.Subscript):  # x.field[i] = v writes x.field
        node = node.value
    if isinstance(node, ast.Attribute):
        return [(node.attr, node.value)]
    return []


def writes(source: str) -> list[tuple[int, str, str]]:
    """(line, object, field) for every write to an attribute named like a Request field."""
    out = []
    for node in ast.walk(ast.parse(source)):
        found = []
        if isinstance(node, ast.Assign):
            for t in node.targets:
                found += _target_fields(t)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.target is not None:
            found += _target_fields(node.target)
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                found += _target_fields(t)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in MUTATORS and isinstance(f.value, ast.Attribute):
                found.append((f.value.attr, f.value.value))
            elif (isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant)):
                found.append((node.args[1].value, node.args[0]))
        for field, obj in found:
            if field in FIELD_OWNERS:
                out.append((node.lineno, ast.unparse(obj), field))
    return out


def second_writers(root: Path = RUNTIME) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        module = path.relative_to(root).with_suffix("").as_posix()
        for line, obj, field in writes(path.read_text()):
            if obj in ("self", "cls"):  # an object's own attributes (no class here holds a Request as self)
                continue
            owner = FIELD_OWNERS[field]
            if module != owner:
                problems.append(f"{rel}:{line}: writes {obj}.{field}, which {owner}.py owns "
                                "(call a method of the owner instead; table in runtime/request.py)")
    return problems


def test_every_request_field_has_one_owner_in_the_table():
    fields = {a.name for a in Request.__attrs_attrs__}
    assert set(FIELD_OWNERS) == fields, (set(FIELD_OWNERS) ^ fields)
    assert set(FIELD_OWNERS.values()) <= {"request", "engine", "scheduler", "runner"}
    for owner in set(FIELD_OWNERS.values()):
        assert (RUNTIME / f"{owner}.py").exists()


def test_no_module_writes_a_request_field_it_does_not_own():
    assert second_writers() == []


@pytest.mark.parametrize("line", [
    "req.prefilled = 3",
    "req.output_ids.append(tok)",
    "r.status, x = Status.RUNNING, 1",
    "req.cached_tokens += 1",
    "req.logprobs[0] = None",
    "setattr(request, 'error', 'boom')",
    "live.req.caches = None",
])
def test_the_scan_catches_a_second_writer(tmp_path, line):
    """A write the table does not allow, in a module that owns nothing, is reported by file and line."""
    root = tmp_path / "runtime"
    root.mkdir()
    (root / "intruder.py").write_text(f"def f(req, r, request, live, tok, x, Status):\n    {line}\n")
    [problem] = second_writers(root)
    assert problem.startswith("runtime/intruder.py:2: writes ")
