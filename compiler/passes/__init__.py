"""The compiler's choice passes: how a decode step (and a prompt's final chunk) runs, chosen once
at compile time.

Each pass is a plain function `(ChoiceContext) -> Choice | None`, named in DECODE_PASSES and
run in that order by `run_decode_passes`; a pass reads the options (the graph's `decode:`
section under the engine's overrides), the binding (layer shapes, lowering) and the
`Target` (compiler/target.py), and records {choice, alternatives, why}. A choice the compiler
cannot make (which of two arms is faster here) is a *measured* choice: the record lists its
arms and the runtime's gate (runtime/measured_gate.py) picks among them, reporting the arm in
use (`Engine.describe()`). The runtime reads the records and obeys them; nothing rewrites a
plan after compilation. prefill_choices.py holds the prefill plan's: how a prompt's final chunk
runs (whole / split) and whether it is padded.
"""

from .decode_choices import DECODE_PASSES, ChoiceContext, run_decode_passes
from .prefill_choices import run_prefill_passes

__all__ = ["DECODE_PASSES", "ChoiceContext", "run_decode_passes", "run_prefill_passes"]
