"""Built-in chat templates: ChatML, for `graphc serve --chat-template chatml` (a base model
without a template of its own) and for the test models `graphc make-model` writes."""

from __future__ import annotations

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

BUILTIN = {"chatml": CHATML}
