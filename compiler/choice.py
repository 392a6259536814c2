"""A choice a compiler pass made, as plan data (`Plan.choices`; `graphc inspect` prints them)."""

from __future__ import annotations

import attrs


@attrs.frozen
class Choice:
    """name: what was chosen ("attention (eager steps)"); choice: the one taken; alternatives:
    every one the pass had; why: the facts that decided it (options, target, layer shapes).
    arms: for a *measured* choice, the arms the runtime's gate picks among per batch-size bucket
    (runtime/measured_gate.py); `choice` then names the gate ("measured")."""

    name: str
    choice: str
    alternatives: tuple
    why: str
    arms: tuple = ()

    @property
    def measured(self) -> bool:
        return bool(self.arms)

    def to_dict(self) -> dict:
        return {"name": self.name, "choice": self.choice, "alternatives": list(self.alternatives),
                "why": self.why, "arms": list(self.arms)}

    @classmethod
    def from_dict(cls, d: dict) -> "Choice":
        return cls(d["name"], d["choice"], tuple(d["alternatives"]), d["why"], tuple(d.get("arms", ())))
