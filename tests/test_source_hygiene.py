"""The package's source stays small, its comments say why, and it holds no dead code.

The package is every .py file of the repository outside tests/, benchmarks/ and hidden or
build folders (.venv, .ci, __pycache__): contracts/, compiler/, runtime/, cli/, graphs/, examples/.

- No file over MAX_LINES lines: a file that grows past it holds more than one thing; split it
  into files named for what each holds (runtime/compiled_decode_kv.py beside compiled_decode.py).
- No history in comments or docstrings: "run 12", "session 3" say when something was found,
  which a reader cannot look up and which stops being true; say why the code is so, and name the
  measurement (its numbers, the probe under benchmarks/ that makes them). A range ("ids run
  1..N") is not history.
- No statement after a `return`, `raise`, `continue` or `break` in the same block: it never runs.

Each check is a plain function of a file's text, and each has a test below that feeds it a
violation, so a check that stopped finding anything fails too.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_PACKAGE = {"tests", "benchmarks", "build", "dist", "__pycache__"}
MAX_LINES = 400
HISTORY = re.compile(r"\b(?:run|session)\s+#?\d+\b(?!\.\.)", re.IGNORECASE)
ENDS_BLOCK = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def package_files(root: Path = ROOT) -> list[Path]:
    """The package's .py files under `root` (folders pruned, not walked: .venv is large)."""
    out = []
    for here, dirs, files in os.walk(root):
        top = Path(here) == root
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not d.endswith(".egg-info")
                         and d != "__pycache__" and not (top and d in NOT_PACKAGE))
        out += [Path(here) / f for f in sorted(files) if f.endswith(".py")]
    return out


def too_long(text: str) -> bool:
    return len(text.splitlines()) > MAX_LINES


def prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring (a string statement: module, class, function
    and attribute docstrings), not the code's other strings."""
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            out.append((node.lineno, node.value.value))
    return out


def history_mentions(text: str) -> list[tuple[int, str]]:
    """(line, the match) for each "run N" / "session N" in the comments and docstrings."""
    return sorted((line, m.group(0)) for line, s in prose(text) for m in HISTORY.finditer(s))


def unreachable(text: str) -> list[tuple[int, str]]:
    """(line, the statement that ends the block) for each block with statements after its
    return / raise / continue / break."""
    out = []
    for node in ast.walk(ast.parse(text)):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for stmt, after in zip(block, block[1:]):
                if isinstance(stmt, ENDS_BLOCK):
                    out.append((after.lineno, type(stmt).__name__.lower()))
                    break
    return sorted(out)


def _scan(check) -> list[str]:
    found = []
    for path in package_files():
        for line, what in check(path.read_text()):
            found.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    return found


# -- the package ---------------------------------------------------------------------------------

def test_the_scan_sees_the_package():
    rel = {p.relative_to(ROOT).as_posix() for p in package_files()}
    assert {"runtime/engine.py", "compiler/bind.py", "cli/__init__.py"} <= rel
    assert not any(r.startswith(("tests/", "benchmarks/", ".")) for r in rel)


def test_no_file_over_the_line_limit():
    long = [f"{p.relative_to(ROOT)}: {len(p.read_text().splitlines())} lines" for p in package_files()
            if too_long(p.read_text())]
    assert not long, f"split these into files named for what each holds (limit {MAX_LINES}): {long}"


def test_no_history_in_comments():
    found = _scan(history_mentions)
    assert not found, f"say why, not when (which run or session found it): {found}"


def test_no_unreachable_statements():
    found = _scan(unreachable)
    assert not found, f"statements after a block's end never run: {found}"


# -- each check finds what it is for -------------------------------------------------------------

def test_the_package_scan_skips_tests_benchmarks_and_hidden_folders(tmp_path):
    for rel in ("runtime/big.py", "runtime/cache/small.py", "tests/test_big.py", "benchmarks/b.py",
                ".venv/lib/x.py", "runtime/__pycache__/c.py", "graphc.egg-info/d.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n" * (MAX_LINES + 1))
    files = [p.relative_to(tmp_path).as_posix() for p in package_files(tmp_path)]
    assert files == ["runtime/big.py", "runtime/cache/small.py"]
    assert too_long((tmp_path / "runtime/big.py").read_text())
    assert not too_long("x = 1\n" * MAX_LINES)


def test_history_is_found_in_comments_and_docstrings_only():
    src = '''"""Module docstring: measured in Session 4."""
x = 1  # faster since run 12
label = "run 5"  # a string the code uses is not a comment


def f():
    """Slot ids run 1..capacity; each check runs 3 times."""
    return "session 9"
'''
    assert history_mentions(src) == [(1, "Session 4"), (2, "run 12")]
    assert history_mentions("# (run #37) the scatter won\n") == [(1, "run #37")]
    assert history_mentions("# a run of 12 steps\n") == []


def test_unreachable_statements_are_found_in_every_kind_of_block():
    src = '''
def f(xs):
    for x in xs:
        if x:
            continue
            print(x)
        else:
            break
            print("never")
    try:
        return 1
        f(xs)
    finally:
        raise ValueError
        pass
'''
    assert unreachable(src) == [(6, "continue"), (9, "break"), (12, "return"), (15, "raise")]


def test_a_block_that_ends_last_is_fine():
    src = '''
def f(x):
    if x:
        return 1
    while x:
        if x > 2:
            break
        x -= 1
    else:
        raise ValueError(x)
    return 0
'''
    assert unreachable(src) == []
