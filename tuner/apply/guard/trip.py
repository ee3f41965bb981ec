"""One trip of the guard's repair ladder as data: the findings it answers, the batch they are
diagnosed on, what the rungs found and did (``Trip``), how it ends (``End``), the kinds of
repair it made (``LAYERS``, ``SCALE``: what a take-back rejects), the loss-scale changes it
decided (``scales.Rescale``), and a rung's type (``Rung``) with what it sees of the ladder
(``LadderState``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import keras

from tuner.apply.guard.cause import Probe
from tuner.apply.guard.detectors import Finding, TripReport
from tuner.apply.guard.failures import of_precision, of_the_scale
from tuner.apply.guard.scales import Rescale, ScaleWatch
from tuner.apply.guard.training import Replaced, Training

LAYERS, SCALE = "layers", "scale"   # the kinds of repair a trip makes (what a take-back rejects)


class End(enum.Enum):
    """How a trip ends: the next rung runs (``GOING``), none does (``DONE``), or the training
    stops, out of repairs with no last resort (``STOP``)."""

    GOING = "going"
    DONE = "done"
    STOP = "stop"


@dataclass(frozen=True)
class LayerMove:
    """A layer moved to float32 for its backward pass, and the policies it changed (undone
    where moving layers does not make the gradients fit)."""

    layer: str
    changed: list


@dataclass
class Trip:
    """One repair: the findings, the batch they are diagnosed on, and what the rungs found and
    did. ``watches``: every optimizer whose loss scale failed (``watch``: the first);
    ``replaced``: the state before it, to take it back; ``repairs``: what kinds of repair it
    made (``LAYERS``, ``SCALE``)."""

    findings: list[Finding]
    batch: Any
    watches: list[ScaleWatch]
    replaced: Replaced | None = None
    restored: int | None = None     # the step of the snapshot put back
    found: Probe | None = None
    broken: bool = False            # the update made the weights non-finite
    moved: list[str] = field(default_factory=list)
    backward: list[LayerMove] = field(default_factory=list)
    rescales: list[Rescale] = field(default_factory=list)
    repairs: set[str] = field(default_factory=set)
    actions: list[str] = field(default_factory=list)
    why: str = ""
    end: End = End.GOING

    @property
    def kind(self) -> str:
        return self.findings[0].kind

    @property
    def seen(self) -> str:
        return "; ".join(finding.seen for finding in self.findings)

    @property
    def watch(self) -> ScaleWatch | None:
        return self.watches[0] if self.watches else None

    @property
    def of_the_scale(self) -> bool:
        return of_the_scale(self.kind)

    @property
    def of_precision(self) -> bool:
        return of_precision(self.kind)

    @property
    def signature(self) -> tuple:
        """What failed, as the ladder remembers it across trips: the optimizers whose scale
        failed, else the kind."""
        return tuple(sorted(w.name for w in self.watches)) if self.of_the_scale else (self.kind,)

    @property
    def action(self) -> str:
        said = "; ".join(self.actions)
        return f"restored step {self.restored}; {said}" if self.restored is not None else said

    def x(self) -> Any:
        return keras.utils.unpack_x_y_sample_weight(self.batch)[0]

    def report(self, training: Training) -> TripReport:
        return TripReport(self.kind, training.position, self.restored is not None,
                          frozenset(self.repairs), self.replaced, self.signature,
                          training.step, self.action)


class LadderState(Protocol):
    """What a rung sees of the ladder (``ladder.Ladder``) it runs on, and may change: the
    watched training, the repairs spent of ``max_repairs``, the trips in a row that repaired
    nothing, the repairs taken back for each failure (``rejected``, by trip signature) and the
    failures left as they are (``tolerated``)."""

    training: Training
    repairs: int
    max_repairs: int
    found_nothing: int
    rejected: dict[tuple, set[str]]
    tolerated: set[tuple]

    def allows(self, trip: Trip, repair: str) -> bool:
        """May ``trip`` make ``repair``? Not where it was taken back for the same failure."""


# A rung: called with the ladder and the trip; it may end the trip.
Rung = Callable[[LadderState, Trip], None]
