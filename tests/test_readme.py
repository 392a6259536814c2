"""The README's commands work as written: every `graphc ...` line of its bash blocks parses
(flags and values, as `graphc ... --help` would see them), the install lines name extras that
pyproject.toml defines, .ci/run runs the README's test command, the Python blocks compile, and
the cheap commands (make-model, generate, inspect) run."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

from graphc.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def commands() -> list[str]:
    """Each command line of the bash blocks, comments stripped, `a && b` split."""
    out = []
    for block in blocks("bash"):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            out += [part.strip() for part in line.split("&&") if part.strip()]
    return out


def graphc_argv(cmd: str) -> list[str] | None:
    if cmd.startswith("mlx.launch"):  # mlx.launch ... -- $(which graphc) serve ...
        cmd = "graphc " + cmd.split("$(which graphc)", 1)[1]
    return shlex.split(cmd)[1:] if cmd.startswith("graphc ") else None


def test_readme_opens_with_install_and_demo_then_install_and_tests():
    first, second = commands()[:4:2], commands()[1:4:2]
    assert first[0].startswith("pip install -e") and second[0].startswith("graphc generate")
    assert first[1].startswith("pip install -e") and "pytest" in second[1]


def test_install_lines_name_defined_extras_and_ci_runs_the_readme_test_command():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installs = [c for c in commands() if c.startswith("pip install")]
    assert installs
    for cmd in installs:
        named = re.search(r"\.\[([^\]]+)\]", cmd).group(1).split(",")
        assert set(named) <= set(extras), cmd
    assert {"server", "client"} <= set(re.search(r"\.\[([^\]]+)\]", installs[0]).group(1).split(","))
    test_line = next(b for b in blocks("bash") if "pytest" in b).strip()
    assert test_line in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("cmd", [c for c in commands() if graphc_argv(c) is not None])
def test_every_graphc_command_parses(cmd):
    args = build_parser().parse_args(graphc_argv(cmd))
    assert callable(args.func)


@pytest.mark.parametrize("i", range(len(blocks("python"))))
def test_python_blocks_compile(i):
    compile(blocks("python")[i], f"README.md python block {i}", "exec")


def test_cheap_commands_run(tmp_path, capsys):
    """make-model, generate and inspect as the README writes them, on a folder under tmp_path."""
    tiny = str(tmp_path / "tiny-llama")
    ran = 0
    for cmd in commands():
        argv = graphc_argv(cmd)
        if argv is None or argv[0] not in ("make-model", "generate", "inspect"):
            continue
        argv = [tiny if a == "/tmp/tiny-llama" else a for a in argv]
        if argv[0] == "generate":
            argv += ["--max-tokens", "2"]  # the last flag wins: a short run
        assert main(["-q", *argv]) == 0, cmd
        ran += 1
    assert ran >= 4
    assert "decode" in capsys.readouterr().out
