"""The guard's repair ladder: one trip per failure a detector found, its rungs tried in order
(``RUNGS``), each acting on the ``Trip`` (what the failing batch showed, what was done) and
each able to end it:

1. ``DataFault``: a batch holding NaN or inf is skipped (no precision repair is spent);
2. ``OutOfRepairs``: with ``max_repairs`` spent, the last resort, or a stop where none is left;
3. ``Diagnose``: the failing state (the snapshot where the weights broke) probed on the batch;
4. ``RecordForNextTime``: under pure 16-bit policies layers cannot move mid-training: the
   layers at fault go into ``guard.config`` for the next training;
5. ``MoveFailingLayers``: each layer whose output is non-finite, or whose backward pass
   overflows at the scale's floor, to float32, verified on the batch, the next then probed;
6. ``MoveDisagreeing``: the layers whose output disagrees with float32, kept if the model's
   output comes closer;
7. ``SearchForTheCause``: for a precision failure still there, the smallest set of layers whose
   float32 brings the model back (``float32_set``);
8. ``KeepMoved``: the moved layers written into the config, the step traced anew;
9. ``AdjustScale``: the loss scale's floor lowered, a fixed scale lowered, or the scale reset,
   decided on the failing state;
10. ``Restore``: the last snapshot (the training's start for an early precision failure) put
    back, the scale change made on it;
11. ``NothingRepaired``: twice with nothing to repair, the last resort.

A new repair is one rung here and one line in ``RUNGS``. Past 300 lines: the rungs read top to
bottom in the order they run, which one file keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import keras

from tuner.apply.guard import cause, fidelity, float32_set, precision_loss, readings, scales
from tuner.apply.guard.cause import Probe
from tuner.apply.guard.detectors import Finding
from tuner.apply.guard.failures import Failure
from tuner.apply.guard.scales import ScaleWatch
from tuner.apply.guard.training import Training


@dataclass
class Trip:
    """One repair: the failure, the batch it is diagnosed on, and what the rungs found and
    did. ``done``: no further rung runs; ``stop``: out of repairs with no last resort."""

    kind: Failure
    seen: str
    watch: ScaleWatch | None
    batch: Any
    restored: int | None = None     # the step of the snapshot put back
    found: Probe | None = None
    broken: bool = False            # the update made the weights non-finite
    moved: list[str] = field(default_factory=list)
    backward: list[tuple[str, list]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    rescale: Callable[[], str] | None = None
    why: str = ""
    done: bool = False
    stop: bool = False

    @property
    def action(self) -> str:
        said = "; ".join(self.actions)
        return f"restored step {self.restored}; {said}" if self.restored is not None else said

    def x(self) -> Any:
        return keras.utils.unpack_x_y_sample_weight(self.batch)[0]


class Ladder:
    """The rungs and what they share across trips: repairs spent, trips that repaired nothing
    in a row, and what was tried (for the message that stops a training)."""

    def __init__(self, training: Training, max_repairs: int) -> None:
        self.training = training
        self.max_repairs = max_repairs
        self.repairs = 0
        self.found_nothing = 0
        self.tried: list[str] = []

    def climb(self, finding: Finding) -> Trip:
        training = self.training
        watch = finding.watch or next(
            (each for each in training.scales if each.scaled and each.applied), None)
        trip = Trip(Failure(finding.kind), finding.seen, watch, training.batch())
        if trip.kind.of_precision:
            training.restart_from_start()
        trip.restored = training.snapshot.step if training.snapshot else None
        for rung in RUNGS:
            rung(self, trip)
            if trip.done:
                break
        if not trip.stop:
            self.tried.append(trip.action)
        return trip


class DataFault:
    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        if trip.batch is not None and cause.data_non_finite(trip.batch):
            ladder.training.restore()
            trip.actions.append("skipped a batch holding NaN/inf (not precision)")
            trip.why, trip.done = "the batch itself holds NaN or inf", True


class OutOfRepairs:
    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        if ladder.repairs < ladder.max_repairs:
            ladder.repairs += 1
            return
        trip.done, trip.why = True, "out of repairs"
        if not ladder.training.last_resort_left():
            trip.stop = True
            return
        trip.actions.append(ladder.training.last_resort(f"{ladder.repairs} repairs spent"))


class Diagnose:
    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        training = ladder.training
        trip.broken = bool(readings.non_finite_weights(training.model))
        if trip.broken:
            training.restore()   # diagnose on the state that was still good
        if trip.batch is None:
            return
        watch = trip.watch
        scale = watch.scale() if watch else None
        trip.found = cause.probe(training.model, trip.batch, scale)
        if trip.found.backward and not trip.found.failing_forward and watch is not None \
                and watch.dynamic and scale > watch.floor:
            # Above its floor a dynamic scale backs off by itself: only a backward pass that
            # overflows at the floor is a layer's fault.
            trip.found = cause.probe(training.model, trip.batch, watch.floor)


def _layers_repairable(training: Training, trip: Trip) -> bool:
    return trip.batch is not None and trip.found is not None and training.sixteen_bit


class RecordForNextTime:
    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        training = ladder.training
        if not _layers_repairable(training, trip) or not training.config.weights_16bit:
            return
        layers = [name for name in [trip.found.layer] if name] + [
            item.layer for item in fidelity.compare_layers(training.model, trip.x())
            if item.layer not in training.config.float32.layers]
        layers = list(dict.fromkeys(layers))
        if layers:
            training.amend(tuple(layers))
            trip.moved = layers   # named in the event, though not moved
            trip.actions.append(
                f"cannot move {', '.join(layers)} to float32 mid-training under pure "
                f"{training.config.policy} (its weights are 16-bit): guard.config builds it in "
                "float32 next time")


def _moving(training: Training, trip: Trip) -> bool:
    return _layers_repairable(training, trip) and not training.config.weights_16bit


class MoveFailingLayers:
    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        training = ladder.training
        if not _moving(training, trip):
            return
        model, found, watch = training.model, trip.found, trip.watch
        scale = None if watch is None else watch.floor if watch.dynamic else watch.scale()
        while found.failing and found.layer and found.layer not in trip.moved:
            changed = cause.place_in_float32(model, training.config, found.layer)
            if not changed:
                break
            again = cause.probe(model, trip.batch, scale)
            if again.layer == found.layer and again.failing:
                cause.undo(changed)
                break
            trip.moved.append(found.layer)
            if found.forward is None:
                trip.backward.append((found.layer, changed))
            found = again
        if trip.backward and (found.backward is not None or
                              2 * len(trip.backward) > fidelity.weighted_sixteen_bit(model)):
            # Moving layers did not make the gradients fit, or only by moving most of the
            # model: the loss scale is to change instead (``AdjustScale``).
            for layer, changed in trip.backward:
                cause.undo(changed)
                trip.moved.remove(layer)


class MoveDisagreeing:
    """The layers whose output disagrees with float32 beyond any rounding, moved together
    and kept if the model's output comes closer to float32's. Where it does not, those broken
    on half the batch (a norm outputting zeros: wrong whatever the model's output shows yet,
    early in training when its blocks still add little) are kept alone, unless the output
    moves further away."""

    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        training = ladder.training
        if not _moving(training, trip):
            return
        model, x = training.model, trip.x()
        found = [item for item in fidelity.compare_layers(model, x)
                 if item.layer not in trip.moved
                 and item.layer not in training.config.float32.layers]
        before = fidelity.output_gap(model, x)
        for layers, allowed in (([item.layer for item in found], 0.9),
                                ([item.layer for item in found if item.broken >= 0.5], 1.1)):
            if not layers:
                continue
            changed = [pair for name in layers
                       for pair in cause.place_in_float32(model, training.config, name)]
            if changed and fidelity.output_gap(model, x) < allowed * before:
                trip.moved += layers
                return
            cause.undo(changed)
        if found:
            trip.actions.append(f"{', '.join(item.layer for item in found)} disagree with "
                                "float32 but moving them did not bring the model's output "
                                "closer: left as they were")


class SearchForTheCause:
    """A precision failure that the layers moved so far did not bring back (the batch's loss
    still apart from float32's): the smallest set of layers whose float32 takes the model's
    output back to float32's, moved together. The layers at fault are often not those whose
    output disagrees: a stream's offset rounded away in the stem and the additions shows only
    in the norm or head that subtracts it."""

    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        training = ladder.training
        if not _moving(training, trip) or not trip.kind.of_precision:
            return
        loss = precision_loss.batch_loss(training.model, trip.batch)
        if loss is not None and loss.apart <= precision_loss.GAP:
            return
        found = float32_set.smallest_float32_set(training.model, training.config, trip.batch)
        if found is None:
            return
        for name in found.layers:
            cause.place_in_float32(training.model, training.config, name)
        trip.actions.append(f"searched for the cause: {found.describe()}")
        trip.moved += list(found.layers)


class KeepMoved:
    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        training = ladder.training
        if not trip.moved or training.config.weights_16bit:
            return
        training.amend(tuple(trip.moved))
        training.retrace()
        trip.actions.insert(0, f"moved {', '.join(trip.moved)} to float32")


class AdjustScale:
    """What to do to the failing optimizer's loss scale, decided on the failing state and done
    after the restore (which puts the snapshot's scale back). Gradients that overflow even at
    a dynamic scale's floor lower the floor; a fixed scale they overflow at is lowered; a
    dynamic scale otherwise restarts (a collapsed one at the largest scale the batch fits)."""

    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        training, watch = ladder.training, trip.watch
        if watch is None or not watch.scaled or not trip.kind.of_the_scale:
            return
        fixed = not watch.dynamic
        if trip.batch is not None and trip.kind is not Failure.SCALE_COLLAPSED:
            ceiling = watch.scale() if fixed else watch.floor
            high = scales.exponent(ceiling) - 1
            if scales.overflows(training.model, trip.batch, watch, ceiling):
                fitting = scales.largest_fitting(training.model, trip.batch, watch,
                                                 high - 30, high)
                if fitting is not None:
                    lowered = fitting / 2.0**cause.FLOOR_HEADROOM
                    trip.rescale = lambda: training.set_scale(watch, lowered, fixed)
                    return
        if fixed:
            return
        fitting = training.fitting_scale(watch) if trip.kind is Failure.SCALE_COLLAPSED \
            else None
        initial = fitting if fitting is not None and fitting > watch.floor \
            else training.config.loss_scale.initial_scale

        def reset() -> str:
            watch.optimizer.dynamic_scale.assign(initial)
            watch.optimizer.step_counter.assign(0)
            return f"{watch.owner()}loss scale reset to {initial:g}"

        trip.rescale = reset


class Restore:
    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        ladder.training.restore()
        if trip.rescale is not None:
            trip.actions.append(trip.rescale())


class NothingRepaired:
    def __call__(self, ladder: Ladder, trip: Trip) -> None:
        found = trip.found
        trip.why = found.describe() if found is not None else "no batch to diagnose on"
        if trip.moved or trip.rescale is not None:
            ladder.found_nothing = 0
            return
        ladder.found_nothing += 1
        training = ladder.training
        if ladder.found_nothing >= 2 and training.last_resort_left():
            trip.actions.append(training.last_resort("the failure came back with nothing to "
                                                     "repair"))
        elif found is not None and not found.failing and trip.broken:
            trip.actions.append("went on (every layer's forward and backward pass is finite "
                                "on the batch, yet the update made weights non-finite: the "
                                "optimizer's step or state overflowed; under a pure policy, "
                                "try a larger optimizer epsilon or keep the optimizer state "
                                "in float32)")
        elif found is not None and not found.failing and not trip.kind.of_precision:
            trip.actions.append("went on (nothing non-finite on the batch: not a precision "
                                "failure there)")
        else:
            trip.actions.append("went on from the restored state")


RUNGS = (DataFault(), OutOfRepairs(), Diagnose(), RecordForNextTime(), MoveFailingLayers(),
         MoveDisagreeing(), SearchForTheCause(), KeepMoved(), AdjustScale(), Restore(),
         NothingRepaired())
