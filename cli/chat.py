"""`graphc chat`: a conversation with a model in the terminal (what `mlx_lm.chat` is to mlx-lm).

Each turn is the whole conversation through the model's chat template, run by one Engine; the
prefix cache holds the earlier turns, so a turn computes only its new tokens. The reply streams
to stdout; the prompt, help and notices go to stderr, so `graphc chat < questions.txt > answers.txt`
keeps only the replies. Lines starting with `/` are commands: /reset, /help, /quit (or end of
input). Ctrl-C stops a reply and keeps the conversation as far as it went.
"""

from __future__ import annotations

import sys

import jinja2

from graphc.compiler.chat_templates import read_chat_template
from graphc.runtime import Engine, SamplingParams

from .commands import model_dir_of  # the model folder rules `generate` uses

HELP = ("type a message and press Enter; /reset starts a new conversation, /help shows this, "
        "/quit (or Ctrl-D) ends; Ctrl-C stops a reply")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _say_inline(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def reply(engine: Engine, messages: list[dict], params: SamplingParams, out=None) -> str:
    """Stream the assistant's next turn of `messages` to `out` (stdout); return its text.
    A KeyboardInterrupt aborts the request and keeps what was written."""
    out = out or sys.stdout
    ids = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    rid = engine.add_request(list(ids), params)
    pieces: list[str] = []
    try:
        while engine.has_unfinished():
            for o in engine.step():
                if o.request_id == rid and o.new_text:
                    pieces.append(o.new_text)
                    out.write(o.new_text)
                    out.flush()
    except KeyboardInterrupt:
        engine.abort(rid)
        while engine.has_unfinished():  # let the abort finish so the next turn starts clean
            engine.step()
        _say("\n[stopped]")
    out.write("\n")
    out.flush()
    return "".join(pieces)


def cmd_chat(args) -> int:
    template = read_chat_template(args.chat_template) if args.chat_template else None  # before the load: fail fast
    engine = Engine.load(model_dir_of(args), args.graph, adapter_path=args.adapter_path, cpu_weights=args.cpu_weights)
    if template is not None:
        engine.tokenizer.chat_template = template
    if not getattr(engine.tokenizer, "chat_template", None):
        _say(f"graphc: the model at '{model_dir_of(args)}' has no chat template; give it one with "
             "--chat-template chatml (or a file), or use `graphc generate`")
        return 2
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)
    start = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    messages = list(start)
    _say(f"graphc chat: {HELP}")
    while True:
        try:
            if sys.stdin.isatty():
                if sys.stdout.isatty():
                    line = input(">> ")  # readline's line editing redraws its own prompt
                else:  # replies go to a file: the prompt stays on the terminal
                    _say_inline(">> ")
                    line = input()
            else:
                line = sys.stdin.readline()
                if not line:
                    break
                line = line.rstrip("\n")
        except EOFError:
            break
        except KeyboardInterrupt:
            _say("")
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            break
        if text == "/reset":
            messages = list(start)
            _say("[a new conversation]")
            continue
        if text == "/help":
            _say(HELP)
            continue
        if text.startswith("/"):
            _say(f"unknown command {text.split()[0]}; {HELP}")
            continue
        messages.append({"role": "user", "content": line})
        try:
            messages.append({"role": "assistant", "content": reply(engine, messages, params)})
        except (jinja2.TemplateError, ValueError) as e:  # e.g. a template without a system role
            messages.pop()
            _say(f"graphc: this turn was not sent: {e}")
    return 0
