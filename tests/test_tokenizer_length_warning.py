"""transformers warns once that a text longer than the tokenizer file's `model_max_length` "will
result in indexing errors". graphc serves the model's own context (and answers a longer prompt
with its own error), so a loaded engine's tokenizer does not say it: make-model's tokenizer says
4096 while the model serves more."""

from __future__ import annotations

import logging

from graphc.runtime import Engine


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _warnings_while_encoding(tokenizer, text):
    got = _Collect()
    root = logging.getLogger("transformers")  # transformers' loggers do not propagate to the root
    root.addHandler(got)
    try:
        ids = tokenizer.encode(text)
    finally:
        root.removeHandler(got)
    return ids, got.messages


def test_a_prompt_past_the_tokenizer_files_maximum_is_not_called_an_indexing_error(model_dir):
    engine = Engine.load(model_dir("llama"))
    assert engine.tokenizer.model_max_length == 4096  # mlx-lm's wrapper passes the HF tokenizer's attributes on
    ids, said = _warnings_while_encoding(engine.tokenizer, "a fox and a key " * 1500)
    assert len(ids) > 4096
    assert not [m for m in said if "Token indices sequence length" in m], said


def test_the_warning_is_there_without_the_engine(model_dir):
    """The check above can fail: the same tokenizer loaded by mlx-lm alone says it."""
    import mlx_lm

    _, tokenizer = mlx_lm.load(str(model_dir("llama")))
    _, said = _warnings_while_encoding(tokenizer, "a fox and a key " * 1500)
    assert [m for m in said if "Token indices sequence length" in m], said
