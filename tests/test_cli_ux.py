"""The command line's first-hour behaviour: --version, defaults in --help, errors that name the
flag, did-you-mean for a graph name, make-model refusing a non-empty folder without --force,
a .gguf model's served name, `graphc --help` naming every API the server answers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from graphc.cli.main import build_parser, main
from graphc.runtime.server.state import served_name


def test_version_flag_prints_the_version_and_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("graphc ")


@pytest.mark.parametrize("command", ["generate", "serve", "bench", "inspect", "make-model"])
def test_help_shows_defaults(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    assert "(default:" in capsys.readouterr().out or command == "make-model"


@pytest.mark.parametrize("argv,flag", [(["generate", "x", "--prefill-chunk", "0"], "--prefill-chunk"),
                                       (["generate", "x", "--max-tokens", "-1"], "--max-tokens"),
                                       (["serve", "--prefill-chunk", "0"], "--prefill-chunk"),
                                       (["serve", "--max-batch", "zero"], "--max-batch")])
def test_bad_values_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2 and f"argument {flag}:" in capsys.readouterr().err


def test_graph_name_did_you_mean(capsys):
    assert main(["-q", "validate", "densee"]) == 2
    assert "did you mean 'dense'?" in capsys.readouterr().err


def test_make_model_refuses_a_non_empty_folder_without_force(tmp_path, capsys):
    out = tmp_path / "m"
    out.mkdir()
    (out / "config.json").write_text("{}")
    assert main(["make-model", "--arch", "llama", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and (out / "config.json").read_text() == "{}"
    assert main(["make-model", "--arch", "llama", "--out", str(out), "--force"]) == 0
    assert (out / "config.json").read_text() != "{}"
    assert main(["make-model", "--arch", "llama", "--out", str(tmp_path / "new")]) == 0  # a new folder: fine


def test_gguf_served_without_extension():
    assert served_name("/models/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"
    assert served_name("/tmp/tiny-llama") == "tiny-llama"


def test_progress_lines_on_stderr_and_quiet(model_dir):
    model = str(model_dir("llama"))
    run = [sys.executable, "-m", "graphc.cli", "generate", "hi", "--model", model, "--max-tokens", "1"]
    loud = subprocess.run(run, capture_output=True, text=True, check=True)
    assert "loaded weights" in loud.stderr and "hi" in loud.stdout
    quiet = subprocess.run(run[:3] + ["-q"] + run[3:], capture_output=True, text=True, check=True)
    assert "loaded weights" not in quiet.stderr


def test_serve_help_names_every_api_the_server_answers(capsys):
    # The one line a new user reads in `graphc --help`: it must not lag behind the routes. Every
    # POST endpoint of the app that is not an action under another one (/v1/messages/count_tokens)
    # is named there.
    from graphc.runtime.server.app import create_app

    posts = sorted(p for p, ops in create_app().openapi()["paths"].items() if "post" in ops)
    top = [p for p in posts if not any(p != q and p.startswith(q + "/") for q in posts)]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    summary = " ".join(capsys.readouterr().out.split())
    assert len(top) >= 5 and [p for p in top if p not in summary] == []
