"""What the guard records: one ``GuardEvent`` per failure it answered or notice it gave, in
``guard.events``; plain data (``to_dict``) in its MLflow artifact and in ``precision-tuner
train``'s record, where the layers stay a list."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GuardEvent:
    """One thing the guard saw and what it did about it.

    ``epoch``: 1-based; ``step``: steps trained in this ``fit``; ``kind``: a
    ``failures.Failure`` or ``failures.Notice`` value (a plain string); ``seen``: what the
    check saw; ``layers``: the layers moved to float32 or named (empty where none);
    ``cause``: what the failing batch showed; ``action``: what the guard did.
    """

    epoch: int
    step: int
    kind: str
    seen: str
    layers: tuple[str, ...]
    cause: str
    action: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", str(self.kind))
        object.__setattr__(self, "layers", tuple(self.layers))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "layers": list(self.layers)}

    def line(self) -> str:
        """The line the guard prints for it."""
        return (f"precision guard: epoch {self.epoch} step {self.step}: {self.seen} "
                f"[{self.kind}]; cause: {self.cause}; {self.action}")
