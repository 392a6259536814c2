"""`graphc chat` (cli/chat.py): each reply is the engine's greedy answer to the whole
conversation through the chat template, earlier turns come from the prefix cache, and the
commands and refusals say what they do."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from graphc.cli.chat import reply
from graphc.cli.main import main
from graphc.runtime import Engine, SamplingParams


def _run(monkeypatch, capsys, lines: list[str], *argv) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    rc = main(["-q", "chat", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _greedy(engine: Engine, messages: list[dict], n: int) -> str:
    ids = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return engine.generate([list(ids)], SamplingParams(max_tokens=n))[0].text


def test_replies_answer_the_whole_conversation(model_dir, monkeypatch, capsys):
    path = model_dir("llama")
    rc, out, err = _run(monkeypatch, capsys, ["Hello there", "", "/help", "And then?", "/reset", "Hello there",
                                              "/bogus", "/quit", "never sent"],
                        "--model", str(path), "--max-tokens", "6")
    assert rc == 0
    engine = Engine.load(path)
    first = _greedy(engine, [{"role": "user", "content": "Hello there"}], 6)
    second = _greedy(engine, [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": first},
                              {"role": "user", "content": "And then?"}], 6)
    assert out == f"{first}\n{second}\n{first}\n"  # each reply ends its line; /reset: the third starts over
    assert "[a new conversation]" in err and "unknown command /bogus" in err and err.count("/reset starts") == 3


def test_a_system_prompt_opens_the_conversation(model_dir, monkeypatch, capsys):
    path = model_dir("llama")
    rc, out, _ = _run(monkeypatch, capsys, ["Hi"], "--model", str(path), "--max-tokens", "5",
                      "--system-prompt", "You are terse.")
    engine = Engine.load(path)
    assert rc == 0 and out == _greedy(engine, [{"role": "system", "content": "You are terse."},
                                               {"role": "user", "content": "Hi"}], 5) + "\n"
    assert out != _greedy(engine, [{"role": "user", "content": "Hi"}], 5) + "\n"  # the system turn mattered


def test_the_next_turn_reads_the_earlier_ones_from_the_prefix_cache(model_dir):
    engine = Engine.load(model_dir("llama"))
    params = SamplingParams(max_tokens=4)
    messages = [{"role": "user", "content": "Tell me about dragons and their long lives."}]
    messages.append({"role": "assistant", "content": reply(engine, messages, params, out=io.StringIO())})
    before = engine.stats["cached_tokens"]
    messages.append({"role": "user", "content": "More."})
    reply(engine, messages, params, out=io.StringIO())
    assert engine.stats["cached_tokens"] - before >= 10  # the first turn's prompt, at least


def test_a_model_without_a_chat_template_is_refused(model_dir, tmp_path, monkeypatch, capsys):
    d = tmp_path / "base"
    shutil.copytree(model_dir("llama"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    rc, out, err = _run(monkeypatch, capsys, ["Hi"], "--model", str(d))
    assert rc == 2 and out == "" and "has no chat template" in err


@pytest.mark.parametrize("argv", [["--max-tokens", "0"], ["--top-k", "-1"]])
def test_bad_flags(argv, capsys):
    with pytest.raises(SystemExit):
        main(["chat", *argv])
    assert argv[0] in capsys.readouterr().err


def test_chat_template_flag_and_a_template_that_refuses_a_turn(model_dir, tmp_path, monkeypatch, capsys):
    """--chat-template gives a base model ChatML; a turn the template raises on is not sent (the
    conversation goes on without it)."""
    d = tmp_path / "base"
    shutil.copytree(model_dir("llama"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    rc, out, _ = _run(monkeypatch, capsys, ["Hi"], "--model", str(d), "--chat-template", "chatml", "--max-tokens", "4")
    engine = Engine.load(model_dir("llama"))  # its own template is ChatML too
    assert rc == 0 and out == _greedy(engine, [{"role": "user", "content": "Hi"}], 4) + "\n"
    picky = ("{% for m in messages %}{% if m.content == 'bad' %}{{ raise_exception('no bad words') }}{% endif %}"
             "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{{ '<|im_start|>assistant\\n' }}")
    rc, out, err = _run(monkeypatch, capsys, ["bad", "Hi"], "--model", str(d), "--chat-template", picky,
                        "--max-tokens", "4")
    assert rc == 0 and "this turn was not sent" in err and "no bad words" in err
    assert out == _greedy(engine, [{"role": "user", "content": "Hi"}], 4) + "\n"  # "bad" left no trace
