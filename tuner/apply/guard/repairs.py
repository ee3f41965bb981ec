"""The guard's repairs (a mixin of ``PrecisionGuard``, which holds the model, the config, the
kept batch, the snapshot and the optimizer): one trip sized by what the failing batch shows
(``_trip``): restore; move every layer at fault, each verified; for a precision failure, the
smallest set of layers whose float32 brings the output back (``float32_set``); lower the floor
or reset a collapsed scale; then the last resort (every layer in float32, which ends the
watch), or ``GuardError`` where none exists (pure 16-bit policies).
"""

from __future__ import annotations

import dataclasses

import keras

from tuner.apply.guard import (cause, fidelity, float32_set, precision_loss, readings, report,
                               scales)
from tuner.apply.guard.failures import Failure, Notice
from tuner.apply.guard.scales import ScaleWatch
from tuner.apply.guard.watch import SpikeWatch
from tuner.errors import GuardError


class Repairs:
    """What a trip does; mixed into ``PrecisionGuard``."""

    def _trip(self, kind: Failure, seen: str, watch: ScaleWatch | None = None) -> None:
        kind, model, batch = Failure(kind), self.model, self._batch()
        watch = watch or next((each for each in self._scales if each.scaled and each.applied),
                              None)
        if kind.of_precision and self._start is not None:
            # Early on, the training so far is thrown away: its weights learned to live with
            # the rounding (the float32 layers would start from weights fitted to it).
            self._snapshot, self._start = self._start, None
        restored = self._snapshot.step if self._snapshot else None
        if batch is not None and cause.data_non_finite(batch):
            if self._snapshot is not None:  # a data fault: it spends no precision repair
                self._snapshot.restore(model)
            self._finish_trip(kind, seen, (), "skipped a batch holding NaN/inf (not precision)",
                              "the batch itself holds NaN or inf", restored)
            return
        if self.repairs >= self.max_repairs:
            if not self._last_resort_left():
                self._stop(seen)
            action = self._last_resort(f"{self.repairs} repairs spent")
            self._finish_trip(kind, seen, (), action, "out of repairs", restored)
            return
        self.repairs += 1
        broken = readings.non_finite_weights(model)
        if broken and self._snapshot is not None:
            self._snapshot.restore(model)  # diagnose on the state that was still good
        scale = watch.scale() if watch else None
        found = cause.probe(model, batch, scale) if batch is not None else None
        if found is not None and found.backward and not found.failing_forward \
                and watch.dynamic and scale > watch.floor:
            found = cause.probe(model, batch, watch.floor)  # above it, the scale backs off
        layers, actions = self._repair_layers(kind, found, batch, watch)
        scale_action = self._repair_scale(kind, batch, watch)
        if self._snapshot is not None:
            self._snapshot.restore(model)
        if scale_action is not None:
            actions.append(scale_action())
        if layers or scale_action is not None:
            self._found_nothing = 0
        else:
            self._found_nothing += 1
            if self._found_nothing >= 2 and self._last_resort_left():
                actions.append(self._last_resort("the failure came back with nothing to repair"))
            elif found is not None and not found.failing and broken:
                actions.append("went on (every layer's forward and backward pass is finite on "
                               "the batch, yet the update made weights non-finite: the "
                               "optimizer's step or state overflowed; under a pure policy, "
                               "try a larger optimizer epsilon or keep the optimizer state in "
                               "float32)")
            elif found is not None and not found.failing and not kind.of_precision:
                actions.append("went on (nothing non-finite on the batch: not a precision "
                               "failure there)")
            else:
                actions.append("went on from the restored state")
        why = found.describe() if found is not None else "no batch to diagnose on"
        self._finish_trip(kind, seen, layers, "; ".join(actions), why, restored)

    def _finish_trip(self, kind: str, seen: str, layers: list[str] | tuple, action: str,
                     why: str, restored: int | None) -> None:
        if restored is not None:
            action = f"restored step {restored}; {action}"
        self.model.reset_metrics()
        for watch in self._scales:   # the snapshot's counts
            watch.iterations, watch.skipped_run = watch.read_iterations(), 0
        self._losses.reset()
        if restored is not None:   # the loss goes back to the snapshot's level: learn it anew
            self._spikes = SpikeWatch(sigmas=self.spike_sigmas)
        self._suspects = {}
        self._tried.append(action)
        self._record(kind, seen, layers, action, why)

    def _repair_layers(self, kind: Failure, found, batch, watch: ScaleWatch | None
                       ) -> tuple[list[str], list[str]]:
        """Every layer the batch shows failing, on the failing state: non-finite outputs (one
        after another: moving one lets the next show), outputs that disagree with float32, and
        backward passes that overflow where no loss scale helps. Returns the layers and what
        was done."""
        if batch is None or found is None or self.config.compute_dtype == "float32" \
                or not self._traceable:
            return [], []
        x = keras.utils.unpack_x_y_sample_weight(batch)[0]
        if self.config.weights_16bit:
            layers = [name for name in [found.layer] if name] + [
                item.layer for item in fidelity.compare_layers(self.model, x)
                if item.layer not in self.config.float32.layers]
            layers = list(dict.fromkeys(layers))
            if not layers:
                return [], []
            self._amend(tuple(layers))
            return layers, [f"cannot move {', '.join(layers)} to float32 mid-training under "
                            f"pure {self.config.policy} (its weights are 16-bit): guard.config "
                            "builds it in float32 next time"]
        moved, actions, backward = [], [], []
        # Probed where the scale cannot go lower: a dynamic scale above its floor backs off by
        # itself, so only a backward pass that overflows at the floor is a layer's fault.
        scale = None if watch is None else watch.floor if watch.dynamic else watch.scale()
        while found.failing and found.layer and found.layer not in moved:
            changed = cause.place_in_float32(self.model, self.config, found.layer)
            if not changed:
                break
            again = cause.probe(self.model, batch, scale)
            if again.layer == found.layer and again.failing:
                cause.undo(changed)
                break
            moved.append(found.layer)
            if found.forward is None:
                backward.append((found.layer, changed))
            found = again
        if backward and (found.backward is not None
                         or 2 * len(backward) > fidelity.weighted_sixteen_bit(self.model)):
            # Moving layers did not make the gradients fit, or only by moving most of the
            # model: the loss scale is to change instead (``_repair_scale``).
            for layer, changed in backward:
                cause.undo(changed)
                moved.remove(layer)
        moved += self._move_disagreeing(x, moved, actions)
        if kind.of_precision:
            moved += self._move_smallest_set(batch, actions)
        if moved:
            self._amend(tuple(moved))
            self._retrace()
            actions.insert(0, f"moved {', '.join(moved)} to float32")
        return moved, actions

    def _move_disagreeing(self, x, moved: list[str], actions: list[str]) -> list[str]:
        """The layers whose output disagrees with float32 beyond any rounding, moved together
        and kept if the model's output comes closer to float32's. Where it does not, those
        broken on half the batch (a norm outputting zeros: wrong whatever the model's output
        shows yet, early in training when its blocks still add little) are kept alone, unless
        the output moves further away."""
        found = [item for item in fidelity.compare_layers(self.model, x)
                 if item.layer not in moved and item.layer not in self.config.float32.layers]
        before = fidelity.output_gap(self.model, x)
        for layers, allowed in (([item.layer for item in found], 0.9),
                                ([item.layer for item in found if item.broken >= 0.5], 1.1)):
            if not layers:
                continue
            changed = [pair for name in layers
                       for pair in cause.place_in_float32(self.model, self.config, name)]
            after = fidelity.output_gap(self.model, x)
            if changed and after < allowed * before:
                return layers
            cause.undo(changed)
        if found:
            actions.append(f"{', '.join(item.layer for item in found)} disagree with float32 "
                           "but moving them did not bring the model's output closer: left as "
                           "they were")
        return []

    def _move_smallest_set(self, batch, actions: list[str]) -> list[str]:
        """A precision failure that the layers moved so far did not bring back (the batch's
        loss still apart from float32's): the smallest set of layers whose float32 takes the
        model's output back to float32's (``precision_loss``), moved together. The layers at
        fault are often not those whose output disagrees: a stream's offset rounded away in
        the stem and the additions shows only in the norm or head that subtracts it."""
        loss = precision_loss.batch_loss(self.model, batch)
        if loss is not None and loss.apart <= precision_loss.GAP:
            return []
        found = float32_set.smallest_float32_set(self.model, self.config, batch)
        if found is None:
            return []
        for name in found.layers:
            cause.place_in_float32(self.model, self.config, name)
        actions.append(f"searched for the cause: {found.describe()}")
        return list(found.layers)

    def _repair_scale(self, kind: Failure, batch, watch: ScaleWatch | None):
        """What to do to ``watch``'s loss scale, decided on the failing state and done after
        the restore (which puts the snapshot's scale back): a callable, or None. Gradients that
        overflow even at a dynamic scale's floor lower the floor; a fixed scale they overflow
        at is lowered; a dynamic scale otherwise restarts (a collapsed one at the largest scale
        the batch fits)."""
        if watch is None or not watch.scaled or not kind.of_the_scale:
            return None
        fixed = not watch.dynamic
        if batch is not None and kind is not Failure.SCALE_COLLAPSED:
            ceiling = watch.scale() if fixed else watch.floor
            high = scales.exponent(ceiling) - 1
            if scales.overflows(self.model, batch, watch, ceiling):
                fitting = scales.largest_fitting(self.model, batch, watch, high - 30, high)
                if fitting is not None:
                    lowered = fitting / 2.0**cause.FLOOR_HEADROOM
                    return lambda: self._set_scale(watch, lowered, fixed)
        if fixed:
            return None
        fitting = self._fitting_scale(watch) if kind is Failure.SCALE_COLLAPSED else None
        initial = fitting if fitting is not None and fitting > watch.floor \
            else self.config.loss_scale.initial_scale

        def reset() -> str:
            watch.optimizer.dynamic_scale.assign(initial)
            watch.optimizer.step_counter.assign(0)
            return f"{watch.owner()}loss scale reset to {initial:g}"

        return reset

    def _set_scale(self, watch: ScaleWatch, scale: float, fixed: bool) -> str:
        """A fixed scale to ``scale``; a dynamic one's floor to ``scale`` and the scale itself
        to where the batch fits (the headroom above the floor). The config keeps the lowest
        each optimizer needed."""
        optimizer, loss_scale = watch.optimizer, self.config.loss_scale
        optimizer.dynamic_scale.assign(scale if fixed else scale * 2.0**cause.FLOOR_HEADROOM)
        optimizer.step_counter.assign(0)
        if fixed:
            optimizer.initial_scale = scale
            self.config = dataclasses.replace(self.config, loss_scale=dataclasses.replace(
                loss_scale, value=min(scale, loss_scale.value or scale)))
            return (f"{watch.owner()}fixed loss scale lowered to {scale:g} (gradients overflow "
                    "float16 at it)")
        watch.floor = scale
        if hasattr(optimizer, "floor"):
            optimizer.floor = scale
        self._retrace()  # the floor is a constant in the traced step
        self.config = dataclasses.replace(self.config, loss_scale=dataclasses.replace(
            loss_scale, floor=min(scale, loss_scale.floor)))
        return (f"{watch.owner()}loss scale floor lowered to {scale:g} (gradients overflow "
                "float16 at the old floor)")

    def _last_resort_left(self) -> bool:
        return not self.config.weights_16bit and self.config.policy != "float32"

    def _last_resort(self, why: str) -> str:
        if self._snapshot is not None:
            self._snapshot.restore(self.model)
        cause.whole_model_float32(self.model)
        self._retrace()
        self._settled = True   # float32 from here: nothing of 16 bits is left to watch
        self.config = dataclasses.replace(self.config, policy="float32",
                                          loss_scale=type(self.config.loss_scale)(),
                                          weight_update="nearest")
        return f"every layer to float32 (last resort: {why})"

    def _stop(self, seen: str) -> None:
        """Out of repairs with no last resort: stop the training, cleanly (Keras does not call
        ``on_train_end`` when a callback raises)."""
        self.model.stop_training = True
        message = (f"precision guard: {seen} at epoch {self._epoch + 1} step {self._step} after "
                   f"{self.repairs} repairs (tried: {'; '.join(self._tried) or 'nothing'}); "
                   "stopping. Train with guard.config, or in float32.")
        self._record(Notice.GAVE_UP, seen, (), "stopped the training", message)
        self._close()
        raise GuardError(message)

    def _close(self) -> None:
        self._keeper.unwrap()
        report.log_to_mlflow(self.history, [event.to_dict() for event in self.events],
                             self.config)

    def _collapsed(self, watch: ScaleWatch) -> bool:
        """Does the scale sit at its floor needlessly? It does if the batch's gradients fit
        float16 at a scale 2^4 above the floor or more."""
        fitting = self._fitting_scale(watch)
        return fitting is None or fitting >= watch.floor * 2.0**cause.FLOOR_HEADROOM

    def _fitting_scale(self, watch: ScaleWatch) -> float | None:
        if watch.fitted_at != self._step:
            batch = self._batch()
            fitted = None if batch is None else scales.fitting_scale(
                self.model, batch, watch, self.config.loss_scale.initial_scale)
            watch.fitted_at, watch.fitted = self._step, fitted
        return watch.fitted

    def _amend(self, layers: tuple[str, ...]) -> None:
        placement = self.config.float32
        new = tuple(dict.fromkeys(placement.layers + layers))
        provenance = dict(self.config.provenance)
        provenance["guard_repairs"] = [*provenance.get("guard_repairs", []), *layers]
        self.config = dataclasses.replace(
            self.config, float32=dataclasses.replace(placement, layers=new),
            provenance=provenance)
