"""What graphc sets on a tokenizer that mlx_lm.load returns, for every load path."""

from __future__ import annotations


def quiet_length_warning(tokenizer) -> None:
    """Mark transformers' one-time "Token indices sequence length is longer than the specified maximum
    ... will result in indexing errors" as already said. Its maximum is the tokenizer file's
    `model_max_length`, often not the model's context (older configs, test models); graphc checks a
    prompt against the context it serves and answers a longer one with its own error."""
    seen = getattr(tokenizer, "deprecation_warnings", None)  # mlx-lm's wrapper hands it the HF tokenizer's
    if isinstance(seen, dict):
        seen["sequence-length-is-longer-than-the-specified-maximum"] = True
