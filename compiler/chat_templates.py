"""Chat templates: the built-in ChatML (for a base model without a template of its own, and
for the test models `graphc make-model` writes), and reading a `--chat-template` value
(`graphc serve`, `graphc chat`)."""

from __future__ import annotations

from pathlib import Path

import jinja2

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

BUILTIN = {"chatml": CHATML}


def read_chat_template(value: str) -> str:
    """A `--chat-template` value: a built-in name (`chatml`), a file's text, or the template
    itself when it is no file but reads as one; a template jinja cannot parse is refused here, at
    startup, not on every request."""
    p = Path(value).expanduser()
    if value in BUILTIN:
        text = BUILTIN[value]
    elif p.is_file():
        text = p.read_text()
    elif "{%" in value or "{{" in value:
        text = value
    else:
        raise ValueError(f"--chat-template {value!r} is neither a built-in name ({', '.join(BUILTIN)}), "
                         "a file nor a jinja template")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"--chat-template: line {e.lineno}: {e.message}") from None
    return text
