"""max_tokens=0 means the prompt only, everywhere: Engine.generate, `graphc generate`, the server.

The prompt is prefilled (its prompt logprobs computed when asked), no token is generated, and
the request finishes with "length"."""

from __future__ import annotations

from graphc.cli.main import main
from graphc.runtime import Engine, SamplingParams
from server_harness import MODEL


def test_engine_generates_nothing_at_max_tokens_zero(model_dir):
    eng = Engine.load(model_dir("llama"))
    zero, two = eng.generate(["Once upon a time", "Once upon a time"],
                             [SamplingParams(max_tokens=0), SamplingParams(max_tokens=2, ignore_eos=True)])
    assert (zero.token_ids, zero.text, zero.finish_reason) == ([], "", "length")
    assert len(two.token_ids) == 2  # the request beside it is not affected
    assert not eng.has_unfinished()
    [scored] = eng.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=0, prompt_logprobs=1))
    assert scored.token_ids == [] and scored.prompt_logprobs[0] is None and len(scored.prompt_logprobs) == 4


def test_cli_prints_the_prompt_only(model_dir, capsys):
    assert main(["-q", "generate", "Once upon", "--model", str(model_dir("llama")), "--max-tokens", "0"]) == 0
    assert capsys.readouterr().out == "Once upon\n"


def test_server_answers_max_tokens_zero_with_an_empty_choice(client):
    c = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=0)
    assert (c.choices[0].text, c.choices[0].finish_reason, c.usage.completion_tokens) == ("", "length", 0)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=0)
    assert (r.choices[0].message.content or "", r.choices[0].finish_reason) == ("", "length")
