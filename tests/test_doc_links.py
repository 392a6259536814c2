"""The docs point at files that exist: every relative markdown link, every repository path a doc
names in backticks or plain text (benchmarks/..., docs/..., runtime/..., tests/... ending in a
file suffix), every raw result file docs/performance.md names is under benchmarks/results/, and
every `graphc bench` command on that page still parses.
Run artifacts and probes moved out of docs/, so a stale path is the likely way a doc rots."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from graphc.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").rglob("README.md")])
TOP = ("benchmarks", "docs", "runtime", "compiler", "contracts", "cli", "graphs", "tests", "examples")
SUFFIX = r"\.(?:py|md|json|sh|yaml|txt|toml)"
REPO_PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(TOP)})/[\w./-]*?{SUFFIX})(?![\w])")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def links(path: Path) -> list[str]:
    out = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        out.append(target.split("#", 1)[0])
    return out


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_relative_link_resolves(doc):
    missing = [t for t in links(doc) if not (doc.parent / t).exists()]
    assert missing == [], f"{doc_id(doc)} links to missing files: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_repository_path_named_exists(doc):
    named = {m for m in REPO_PATH.findall(doc.read_text()) if not re.search(r"[*{}<>]|\.\.\.|/[A-Z_]+\.", m)}  # globs, placeholders
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == [], f"{doc_id(doc)} names files that do not exist: {missing}"


def expand(name: str) -> list[str]:
    """`h200-cold-prefill-{8b,1b}.json` -> both names; `-1b` after a full name is not expanded."""
    m = re.search(r"\{([^}]*)\}", name)
    if not m:
        return [name]
    return [out for alt in m.group(1).split(",") for out in expand(name[: m.start()] + alt + name[m.end():])]


def test_every_result_file_performance_md_names_is_in_benchmarks_results():
    text = (ROOT / "docs" / "performance.md").read_text()
    names = {n for m in re.findall(r"`((?:h200|h200x2|cpu|serving)[\w{},.*-]*\.json)`", text) for n in expand(m)}
    assert names, "the page names its raw files"
    results = ROOT / "benchmarks" / "results"
    missing = sorted(n for n in names if not list(results.glob(n)))
    assert missing == [], f"docs/performance.md names results that are not in benchmarks/results/: {missing}"


def test_docs_hold_no_run_artifacts():
    # Logs, JSON and plots of runs live in benchmarks/results/ (the few a doc cites) or in git history.
    stray = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*")
                   if p.is_file() and p.suffix not in {".md"})
    assert stray == []


def test_every_graphc_bench_command_on_the_performance_page_parses():
    # The page's numbers are only as good as the commands beside them: each must still be accepted
    # by the CLI as written (a renamed or removed flag fails here, not on the next GPU session).
    text = (ROOT / "docs" / "performance.md").read_text()
    commands = [" ".join(c.split()) for c in re.findall(r"`(graphc bench [^`]*)`", text)]
    assert len(commands) >= 5
    for cmd in commands:
        try:
            build_parser().parse_args(shlex.split(cmd)[1:])
        except SystemExit as e:
            raise AssertionError(f"docs/performance.md: `{cmd}` does not parse") from e
