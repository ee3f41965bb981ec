"""The rungs of the guard's repair ladder (tuner.apply.guard.ladder), top to bottom in the
order they run: each a callable on the ladder and the trip, acting where the ladder's table
(``ladder.ANSWERS``) says it answers the trip's kind, and able to end the trip. What each does
is in ``ladder``'s list. Past 300 lines: they read in the order they run, which one file keeps.
"""

from __future__ import annotations

from tuner.apply.guard import cause, fidelity, float32_set, precision_loss, readings, scales
from tuner.apply.guard.detectors import TripReport
from tuner.apply.guard.failures import Failure
from tuner.apply.guard.scales import Rescale, ScaleWatch
from tuner.apply.guard.training import Training
from tuner.apply.guard.trip import LAYERS, SCALE, End, LadderState, LayerMove, Trip


def _restore(training: Training, trip: Trip) -> None:
    if training.snapshot is not None:
        trip.restored = training.snapshot.step
        training.restore()


class DataFault:
    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        if trip.batch is not None and cause.data_non_finite(trip.batch):
            _restore(ladder.training, trip)
            trip.actions.append("skipped a batch holding NaN/inf (not precision)")
            trip.why, trip.end = "the batch itself holds NaN or inf", End.DONE


class TakeBack:
    """A repaired run doing worse than the run it replaced: the repair taken back (the state,
    config, dtype policies and loss scales as they were before it), and its kinds of repair
    not tried again for that failure (the next trip for it tries the next rung, or leaves it
    as it is). Not a repair spent."""

    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        report: TripReport = trip.findings[0].detail
        report.replaced.put_back(ladder.training)
        ladder.rejected.setdefault(report.signature, set()).update(report.repairs)
        trip.actions.append(f"took back the repair of step {report.step} ({report.action}): "
                            "the run it replaced goes on")
        trip.why, trip.end = "the repaired run does worse than the run it replaced", End.DONE


class OutOfRepairs:
    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        if ladder.repairs < ladder.max_repairs:
            ladder.repairs += 1
            return
        trip.end, trip.why = End.DONE, "out of repairs"
        if not ladder.training.last_resort_left():
            trip.end = End.STOP
            return
        trip.actions.append(ladder.training.last_resort(f"{ladder.repairs} repairs spent"))


class Diagnose:
    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        training = ladder.training
        trip.broken = bool(readings.non_finite_weights(training.model))
        if trip.broken:
            _restore(training, trip)   # diagnose on the state that was still good
        if trip.batch is None:
            return
        watch = trip.watch
        scale = watch.scale() if watch else None
        trip.found = cause.probe(training.model, trip.batch, scale)
        if trip.found.backward and not trip.found.failing_forward and watch is not None \
                and watch.dynamic and scale is not None and scale > watch.floor:
            # Above its floor a dynamic scale backs off by itself: only a backward pass that
            # overflows at the floor is a layer's fault.
            trip.found = cause.probe(training.model, trip.batch, watch.floor)


def _layers_repairable(training: Training, trip: Trip) -> bool:
    return trip.batch is not None and trip.found is not None and training.sixteen_bit


class RecordForNextTime:
    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        training = ladder.training
        if not _layers_repairable(training, trip) or not training.config.weights_16bit:
            return
        assert trip.found is not None   # _layers_repairable checked it
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


def _moving(ladder: LadderState, trip: Trip) -> bool:
    training = ladder.training
    return _layers_repairable(training, trip) and not training.config.weights_16bit \
        and ladder.allows(trip, LAYERS)


class MoveFailingLayers:
    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        training = ladder.training
        if not _moving(ladder, trip):
            return
        model, found, watch = training.model, trip.found, trip.watch
        assert found is not None   # _moving checked it (_layers_repairable)
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
                trip.backward.append(LayerMove(found.layer, changed))
            found = again
        if trip.backward and (found.backward is not None or
                              2 * len(trip.backward) > fidelity.weighted_sixteen_bit(model)):
            # Moving layers did not make the gradients fit, or only by moving most of the
            # model: the loss scale is to change instead (``AdjustScale``).
            for move in trip.backward:
                cause.undo(move.changed)
                trip.moved.remove(move.layer)


class MoveDisagreeing:
    """The layers whose output disagrees with float32 beyond any rounding, moved together
    and kept if the model's output comes closer to float32's. Where it does not, those broken
    on half the batch (a norm outputting zeros: wrong whatever the model's output shows yet,
    early in training when its blocks still add little) are kept alone, unless the output
    moves further away."""

    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        training = ladder.training
        if not _moving(ladder, trip):
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

    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        training = ladder.training
        if not _moving(ladder, trip):
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
    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        training = ladder.training
        if not trip.moved or training.config.weights_16bit:
            return
        training.amend(tuple(trip.moved))
        training.retrace()
        trip.repairs.add(LAYERS)
        trip.actions.insert(0, f"moved {', '.join(trip.moved)} to float32")


class AdjustScale:
    """What to do to each failing optimizer's loss scale, decided on the failing state and done
    after any restore (which puts the snapshot's scale back). Gradients that overflow even at
    a dynamic scale's floor lower the floor; a fixed scale they overflow at is lowered; a
    dynamic scale otherwise restarts (a collapsed one at the largest scale the batch fits)."""

    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        if not ladder.allows(trip, SCALE):
            return
        for watch in trip.watches:
            if watch.scaled:
                rescale = self._rescale(ladder.training, trip, watch)
                if rescale is not None:
                    trip.rescales.append(rescale)
                    trip.repairs.add(SCALE)

    @staticmethod
    def _rescale(training: Training, trip: Trip, watch: ScaleWatch) -> Rescale | None:
        fixed = not watch.dynamic
        if trip.batch is not None and trip.kind != Failure.SCALE_COLLAPSED:
            ceiling = watch.known_scale() if fixed else watch.floor
            high = scales.exponent(ceiling) - 1
            if scales.overflows(training.model, trip.batch, watch, ceiling):
                fitting = scales.largest_fitting(training.model, trip.batch, watch,
                                                 high - 30, high)
                if fitting is not None:
                    return Rescale(watch, "lower", fitting / 2.0**cause.FLOOR_HEADROOM)
        if fixed:
            return None
        fitting = training.fitting_scale(watch) if trip.kind == Failure.SCALE_COLLAPSED \
            else None
        return Rescale(watch, "restart", fitting if fitting is not None and fitting > watch.floor
                       else training.config.loss_scale.initial_scale)


class LeaveAsIs:
    """A failure whose repairs were taken back, with nothing left to try: left as it is (the
    run without a repair did better), and no longer repaired."""

    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        if trip.signature not in ladder.rejected or trip.repairs:
            return
        ladder.tolerated.add(trip.signature)
        ladder.tolerated.update((watch.name,) for watch in trip.watches)
        ladder.repairs -= 1   # nothing was spent
        tried = ", ".join(sorted(ladder.rejected[trip.signature]))
        trip.actions.append(f"left as it is: every repair tried ({tried}) made the training "
                            "worse than the failure; no longer repaired")
        trip.why, trip.end = "repairs taken back", End.DONE


class Restore:
    """The snapshot put back, where the weights changed since it: a trip for a loss scale
    whose updates were skipped (nothing applied, so nothing to undo; another optimizer's
    updates are training, not damage) goes on from where it is; broken weights were put back
    by ``Diagnose``."""

    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        training = ladder.training
        if trip.restored is None and not trip.of_the_scale and training.snapshot is not None \
                and not training.snapshot.holds(training.model):
            _restore(training, trip)
        for change in trip.rescales:
            trip.actions.append(training.rescale(change))


class NothingRepaired:
    def __call__(self, ladder: LadderState, trip: Trip) -> None:
        found = trip.found
        trip.why = found.describe() if found is not None else "no batch to diagnose on"
        if trip.moved or trip.rescales:
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
        elif found is not None and not found.failing and not trip.of_precision:
            trip.actions.append("went on (nothing non-finite on the batch: not a precision "
                                "failure there)")
        else:
            trip.actions.append("went on from the restored state" if trip.restored is not None
                                else "went on")
