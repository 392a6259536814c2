"""Which model types graphc may refuse, and why.

A refusal is allowed only for a type listed here; any other refusal fails the sweep (a model
that used to be served and no longer is). The reason is what docs/models.md shows; the
refusal message itself must name the model type (checked by the test).

FAIL (wrong tokens or logits, an exception after load) is never allowed for any type.
"""

REFUSED: dict[str, str] = {}
