"""What a request that leaves a field out gets (server/defaults.py): sampling defaults from the
flags and the model's generation_config.json, a max_tokens default, and a server-wide chat
template and template arguments, as `graphc serve` reads them and as a live server applies them."""

from __future__ import annotations

import argparse
import json
import logging
import shutil

import httpx
import pytest

from graphc.runtime.server.cli import add_parser, config_from_args
from graphc.runtime.server.defaults import generation_config_defaults, sampling_defaults
from graphc.runtime.server.protocol import ChatCompletionRequest
from graphc.runtime.server.sampling import build_params
from server_harness import MODEL, live_server

HI = [{"role": "user", "content": "Tell me a story about a dragon."}]


def _folder(model_dir, tmp_path, generation_config: dict | None):
    """A copy of the tiny llama folder, with `generation_config` as its generation_config.json."""
    dst = tmp_path / "model"
    shutil.copytree(model_dir("llama"), dst)
    if generation_config is not None:
        (dst / "generation_config.json").write_text(json.dumps(generation_config))
    return dst


def _args(*argv):
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    return p.parse_args(["serve", *argv])


# -- the rules --------------------------------------------------------------------------------
def test_flags_over_the_file_over_openai(model_dir, tmp_path):
    d = _folder(model_dir, tmp_path, {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                      "bos_token_id": 1})
    values, sources = sampling_defaults({"top_k": 5}, str(d), True, 1.0)
    assert values == {"temperature": 0.6, "top_p": 0.95, "top_k": 5}
    assert sources == {"temperature": "generation_config.json", "top_p": "generation_config.json", "top_k": "flag"}
    assert sampling_defaults({}, str(d), False, 1.0)[0] == {"temperature": 1.0}  # --generation-config none
    assert sampling_defaults({}, None, True, 1.0)[0] == {"temperature": 1.0}  # the demo model: no folder
    assert sampling_defaults({}, str(d / "model.gguf"), True, 1.0)[0] == {"temperature": 1.0}


def test_a_file_that_does_not_sample_or_is_wrong_gives_nothing(model_dir, tmp_path, caplog):
    d = _folder(model_dir, tmp_path, {"do_sample": False, "temperature": 0.6})
    assert generation_config_defaults(str(d)) == {}  # transformers decodes greedily there: its numbers are unused
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.7, "top_p": 2.0, "top_k": "x"}))
    with caplog.at_level(logging.WARNING, logger="graphc.server"):
        assert generation_config_defaults(str(d)) == {"temperature": 0.7}
    assert "top_p must be in (0, 1]" in caplog.text and "top_k must be a number" in caplog.text
    (d / "generation_config.json").write_text("{not json")
    assert generation_config_defaults(str(d)) == {}


def test_a_request_field_beats_the_default():
    defaults = {"temperature": 0.25, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "repetition_penalty": 1.2}
    req = ChatCompletionRequest(messages=HI)
    p = build_params(req, max_tokens=4, vocab_size=1000, defaults=defaults)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty) == (0.25, 0.5, 7, 0.1, 1.2)
    req = ChatCompletionRequest(messages=HI, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0)
    p = build_params(req, max_tokens=4, vocab_size=1000, defaults=defaults)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty) == (0.0, 1.0, 0, 0.0, 1.0)


def test_the_flags_parse_into_the_config(tmp_path):
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    c = config_from_args(_args("--temp", "0.3", "--top-k", "20", "--min-p", "0.05", "--max-tokens", "64",
                               "--generation-config", "none", "--chat-template", str(tpl),
                               "--chat-template-args", '{"enable_thinking": false}'))
    assert c.sampling_flags == {"temperature": 0.3, "top_k": 20, "min_p": 0.05}
    assert (c.max_tokens, c.generation_config, c.chat_template_args) == (64, False, {"enable_thinking": False})
    assert c.chat_template == tpl.read_text()
    assert config_from_args(_args("--chat-template", "{{ messages[0].content }}")).chat_template == \
        "{{ messages[0].content }}"
    c = config_from_args(_args())
    assert (c.sampling_flags, c.max_tokens, c.generation_config, c.chat_template) == ({}, None, True, None)


@pytest.mark.parametrize("argv, needle", [
    (["--chat-template-args", "[1]"], "must be a JSON object, got list"),
    (["--chat-template-args", "{oops"], "must be a JSON object"),
    (["--chat-template-args", '{"tokenize": false}'], "may not set tokenize"),
    (["--chat-template", "no-such-file.jinja"], "neither a built-in name (chatml), a file nor a jinja template"),
    (["--chat-template", "{% for m in messages %}"], "--chat-template: line 1"),
    (["--model", "a", "--model", "b", "--chat-template", "{{ x }}"], "with several models"),
])
def test_bad_flags_exit_with_what_is_wrong(argv, needle):
    with pytest.raises(SystemExit) as e:
        config_from_args(_args(*argv))
    assert needle in str(e.value)


@pytest.mark.parametrize("argv", [["--top-p", "0"], ["--temp", "-1"], ["--top-k", "2.5"], ["--max-tokens", "0"]])
def test_out_of_range_sampling_flags_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit):
        _args(*argv)
    assert argv[0] in capsys.readouterr().err


# -- a live server ------------------------------------------------------------------------------
def _chat(srv, **body):
    r = httpx.post(srv.url + "/v1/chat/completions", json={"model": MODEL, "messages": HI, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_generation_config_temperature_serves_requests_without_one(model_dir, tmp_path):
    """The file says greedy (temperature 0): requests without a temperature get the greedy text
    whatever their seed; a flag over it, or the request's own temperature, samples again."""
    d = _folder(model_dir, tmp_path, {"do_sample": True, "temperature": 0.0})
    with live_server(str(d)) as srv:
        greedy = _chat(srv, max_tokens=12, temperature=0.0, ignore_eos=True)["choices"][0]["message"]["content"]
        for seed in range(3):
            assert _chat(srv, max_tokens=12, seed=seed, ignore_eos=True)["choices"][0]["message"]["content"] == greedy
        sampled = {_chat(srv, max_tokens=12, seed=s, temperature=1.0, ignore_eos=True)["choices"][0]["message"]
                   ["content"] for s in range(4)}
        assert sampled - {greedy}, "temperature 1.0 on four seeds never left the greedy text"
    with live_server(str(d), sampling_flags={"temperature": 1.0}) as srv:
        flagged = {_chat(srv, max_tokens=12, seed=s, ignore_eos=True)["choices"][0]["message"]["content"]
                   for s in range(4)}
        assert flagged == sampled  # --temperature 1.0 over the file: the same draws as asking for it


def test_max_tokens_default_on_every_route(model_dir):
    with live_server(model_dir("llama"), max_tokens=3) as srv:
        assert _chat(srv, ignore_eos=True)["usage"]["completion_tokens"] == 3
        assert _chat(srv, ignore_eos=True, max_tokens=5)["usage"]["completion_tokens"] == 5
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "Once", "ignore_eos": True})
        assert r.json()["usage"]["completion_tokens"] == 3  # not OpenAI's 16
        no_eos = {str(t): -100 for t in srv.state.engine.eos_token_ids}  # Responses has no ignore_eos
        r = httpx.post(srv.url + "/v1/responses", json={"model": MODEL, "input": "Hi", "temperature": 0,
                                                        "logit_bias": no_eos}).json()
        assert r["usage"]["output_tokens"] == 3
        assert r["status"] == "incomplete" and r["incomplete_details"]["reason"] == "max_output_tokens"


def test_chat_template_and_its_args(model_dir):
    """--chat-template renders every chat prompt; --chat-template-args are keywords a request's
    chat_template_kwargs override."""
    tpl = "{% for m in messages %}[{{ m.role }}: {{ m.content }}{% if shout %} LOUDLY{% endif %}]{% endfor %}"
    with live_server(model_dir("llama"), chat_template=tpl, chat_template_args={"shout": True}) as srv:
        encode = srv.state.tokenizer._tokenizer.encode
        loud = len(encode("[user: Tell me a story about a dragon. LOUDLY]", add_special_tokens=False))
        quiet = len(encode("[user: Tell me a story about a dragon.]", add_special_tokens=False))
        assert loud != quiet
        assert _chat(srv, max_tokens=1)["usage"]["prompt_tokens"] == loud
        assert _chat(srv, max_tokens=1, chat_template_kwargs={"shout": False})["usage"]["prompt_tokens"] == quiet
        r = httpx.post(srv.url + "/v1/messages/count_tokens", json={"model": MODEL, "messages": HI})
        assert r.json()["input_tokens"] == loud  # every chat route renders with it


def test_chatml_gives_a_base_model_a_chat_template(model_dir, tmp_path):
    """A folder without a chat template: chat is a 400 naming /v1/completions; with
    `--chat-template chatml` (the built-in) it renders ChatML."""
    d = _folder(model_dir, tmp_path, None)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with live_server(str(d)) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "no_chat_template"
    template = config_from_args(_args("--chat-template", "chatml")).chat_template
    with live_server(str(d), chat_template=template) as srv:
        want = srv.state.tokenizer._tokenizer.encode(
            "<|im_start|>user\nTell me a story about a dragon.<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False)
        assert _chat(srv, max_tokens=1)["usage"]["prompt_tokens"] == len(want)


def test_a_response_object_says_the_sampling_it_ran_with(model_dir):
    """Responses echo temperature and top_p: the request's, else the server's default, as OpenAI
    answers 1.0 for a request that sent none."""
    def created(srv, **body):
        return httpx.post(srv.url + "/v1/responses", json={"model": MODEL, "input": "Hi", "max_output_tokens": 2,
                                                          **body}).json()

    with live_server(model_dir("llama")) as srv:
        r = created(srv)
        assert (r["temperature"], r["top_p"]) == (1.0, 1.0)
    with live_server(model_dir("llama"), sampling_flags={"temperature": 0.3, "top_p": 0.9}) as srv:
        r = created(srv)
        assert (r["temperature"], r["top_p"]) == (0.3, 0.9)
        r = created(srv, temperature=0.7)
        assert (r["temperature"], r["top_p"]) == (0.7, 0.9)
