"""Which model types graphc may refuse, and why.

A refusal is allowed only for a type listed here; any other refusal fails the sweep (a model
that used to be served and no longer is). The reason is what docs/models.md shows; the
refusal message itself must name the model type (checked by the test).

FAIL (wrong tokens or logits, an exception after load) is never allowed for any type.
"""

REFUSED: dict[str, str] = {
    # mlx-lm's own plamo3 output depends on the prefill chunk (tiny_configs.NOTES): a server that
    # prefills in chunks cannot reproduce generate_step for prompts longer than one chunk.
    "plamo3": "its sliding layers mask window+1 keys while the rotating cache keeps `window`: "
    "chunked prefill changes mlx-lm's own answer",
}
