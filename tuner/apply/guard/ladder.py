"""The guard's repair ladder: one trip for the findings of one step (every failing optimizer
in it), its rungs tried in order (``RUNGS``), each acting on the ``Trip`` (what the failing
batch showed, what was done) and each able to end it:

1. ``DataFault``: a batch holding NaN or inf is skipped (no precision repair is spent);
2. ``TakeBack``: a repair that left the training worse than the run it replaced
   (``repair_worse``) is taken back, and what it tried is not tried again for that failure;
   (rungs passed to the guard, ``PrecisionGuard(rungs=...)``, run here: before the guard's
   repair budget and last resort, which they neither spend nor meet)
3. ``OutOfRepairs``: with ``max_repairs`` spent, the last resort, or a stop where none is left;
4. ``Diagnose``: the failing state (the snapshot where the weights broke) probed on the batch;
5. ``RecordForNextTime``: under pure 16-bit policies layers cannot move mid-training: the
   layers at fault go into ``guard.config`` for the next training;
6. ``MoveFailingLayers``: each layer whose output is non-finite, or whose backward pass
   overflows at the scale's floor, to float32, verified on the batch, the next then probed;
7. ``MoveDisagreeing``: the layers whose output disagrees with float32, kept if the model's
   output comes closer;
8. ``SearchForTheCause``: for a precision failure still there, the smallest set of layers whose
   float32 brings the model back (``float32_set``);
9. ``KeepMoved``: the moved layers written into the config, the step traced anew;
10. ``AdjustScale``: each failing optimizer's loss scale: its floor lowered, a fixed scale
    lowered, or the scale reset, decided on the failing state;
11. ``LeaveAsIs``: a failure whose every repair was taken back is left as it is;
12. ``Restore``: the last snapshot (the training's start for an early precision failure) put
    back where the weights changed since it (a skipped update changes none), the scale
    changes made on it;
13. ``NothingRepaired``: twice with nothing to repair, the last resort.

Which rung answers which failure is one table, ``ANSWERS``: a rung of the guard acts on a trip
only where the trip's kind is in its row, so a failure kind of a detector of your own is
answered by your rungs alone, and a trip that none of them ends changes no weight, moves no
layer and spends no repair. A new repair is one rung (``trip.Rung``: a callable on the ladder
and the trip) passed to the guard, or one line in ``RUNGS`` and one in ``ANSWERS``. The rungs
themselves are in ``rungs``.
"""

from __future__ import annotations

from typing import Sequence

from tuner.apply.guard.detectors import Finding
from tuner.apply.guard.failures import Failure, of_the_scale
from tuner.apply.guard.rungs import (
    AdjustScale,
    DataFault,
    Diagnose,
    KeepMoved,
    LeaveAsIs,
    MoveDisagreeing,
    MoveFailingLayers,
    NothingRepaired,
    OutOfRepairs,
    RecordForNextTime,
    Restore,
    SearchForTheCause,
    TakeBack,
)
from tuner.apply.guard.training import Replaced, Training
from tuner.apply.guard.trip import End, Rung, Trip

__all__ = ["ANSWERS", "End", "Ladder", "Rung", "RUNGS", "Trip"]


class Ladder:
    """The rungs and what they share across trips: repairs spent, trips that repaired nothing
    in a row, what was tried (for the message that stops a training), the repairs taken back
    for each failure (``rejected``) and the failures left as they are (``tolerated``)."""

    def __init__(self, training: Training, max_repairs: int, rungs: Sequence[Rung] = ()) -> None:
        self.training = training
        self.max_repairs = max_repairs
        self.repairs = 0
        self.found_nothing = 0
        self.tried: list[str] = []
        self.rejected: dict[tuple, set[str]] = {}
        self.tolerated: set[tuple] = set()
        at = next(index for index, rung in enumerate(RUNGS) if isinstance(rung, OutOfRepairs))
        self.rungs: tuple[Rung, ...] = (*RUNGS[:at], *rungs, *RUNGS[at:])

    def answers(self, finding: Finding) -> bool:
        """Is this finding still repaired (not a failure left as it is)?"""
        if not of_the_scale(finding.kind):
            return (finding.kind,) not in self.tolerated
        return finding.watch is None or (finding.watch.name,) not in self.tolerated

    def allows(self, trip: Trip, repair: str) -> bool:
        """May this trip make ``repair``? Not where it was taken back for the same failure."""
        return repair not in self.rejected.get(trip.signature, set())

    def climb(self, found: list[Finding]) -> Trip:
        training = self.training
        worse = [finding for finding in found if finding.kind == Failure.REPAIR_WORSE]
        found = worse[:1] or found
        watches = list({id(f.watch): f.watch for f in found if f.watch is not None}.values())
        if not watches and not worse:
            watches = [each for each in training.scales if each.scaled and each.applied][:1]
        trip = Trip(found, training.batch(), watches)
        if not worse:
            trip.replaced = Replaced(training)
        if trip.of_precision:
            training.restart_from_start()
        kind = str(trip.kind)
        for rung in self.rungs:
            if kind not in ANSWERS.get(type(rung), {kind}):   # a rung of your own: every kind
                continue
            rung(self, trip)
            if trip.end is not End.GOING:
                break
        if not trip.actions and kind not in OWN_FAILURES:
            trip.actions.append(f"nothing changed: no rung answers {kind}")
            trip.why, trip.end = f"no rung answers {kind}", End.DONE
        if trip.end is not End.STOP:
            self.tried.append(trip.action)
        return trip


RUNGS: tuple[Rung, ...] = (
    DataFault(), TakeBack(), OutOfRepairs(), Diagnose(), RecordForNextTime(),
    MoveFailingLayers(), MoveDisagreeing(), SearchForTheCause(), KeepMoved(), AdjustScale(),
    LeaveAsIs(), Restore(), NothingRepaired())

# Which rung answers which failure kind: a rung of the guard acts on a trip only where its
# kind is in the rung's row. A kind of your own is in none: your rungs answer it.
OWN_FAILURES = frozenset(kind.value for kind in Failure)
_REPAIRED = OWN_FAILURES - {Failure.REPAIR_WORSE.value}   # a take-back is not a repair
_OF_THE_SCALE = frozenset(kind.value for kind in Failure if kind.of_the_scale)
_OF_PRECISION = frozenset(kind.value for kind in Failure if kind.of_precision)
ANSWERS: dict[type, frozenset[str]] = {
    DataFault: _REPAIRED,
    TakeBack: frozenset({Failure.REPAIR_WORSE.value}),
    OutOfRepairs: _REPAIRED,
    Diagnose: _REPAIRED,
    RecordForNextTime: _REPAIRED,
    MoveFailingLayers: _REPAIRED,
    MoveDisagreeing: _REPAIRED,
    SearchForTheCause: _OF_PRECISION,
    KeepMoved: _REPAIRED,
    AdjustScale: _OF_THE_SCALE,
    LeaveAsIs: _REPAIRED,
    Restore: _REPAIRED,
    NothingRepaired: _REPAIRED,
}
