"""The guard's repairs (a mixin of ``PrecisionGuard``, which holds the state they read: the
model, the config, the kept batch, the snapshot, the optimizer): one trip sized by what the
failing batch shows (``_trip``: every layer whose output is non-finite, disagrees with float32,
or whose backward pass overflows where no loss scale helps, moved to float32 and verified; the
floor lowered where gradients overflow even at it, or a collapsed scale reset to the largest the
batch fits), the last resort (every layer in float32), and ``GuardError`` after it.
"""

from __future__ import annotations

import dataclasses
import math

import keras

from tuner.apply.config import PURE_POLICIES
from tuner.apply.guard import cause, fidelity, readings
from tuner.apply.guard.state import Snapshot
from tuner.errors import TunerError

_FLOOR_HEADROOM = 4   # a lowered floor sits 2^4 below the scale that one batch fits
SCALE_KINDS = ("scale_at_floor", "scale_collapsed", "skipped_updates")


class GuardError(TunerError):
    """The guard ran out of repairs; its message says what it saw and tried."""


class Repairs:
    """What a trip does; mixed into ``PrecisionGuard``."""

    def _trip(self, kind: str, seen: str) -> None:
        model, batch = self.model, self._batch()
        restored = self._snapshot.step if self._snapshot else None
        if self.repairs >= self.max_repairs:
            if not self._last_resort_left():
                self._stop(seen)
            action = self._last_resort(f"{self.repairs} repairs spent")
            self._finish_trip(kind, seen, None, action, "out of repairs", restored)
            return
        self.repairs += 1
        if readings.non_finite_weights(model) and self._snapshot is not None:
            self._snapshot.restore(model)  # diagnose on the state that was still good
        found = cause.probe(model, batch, self._scale()) if batch is not None else None
        if found is not None and found.data_non_finite:
            if self._snapshot is not None:
                self._snapshot.restore(model)
            action = "skipped a batch holding NaN/inf (not precision)"
            self._finish_trip(kind, seen, None, action, found.describe(), restored)
            return
        layers, actions = self._repair_layers(kind, found, batch)
        scale_action = self._repair_scale(kind, batch)
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
            elif found is not None and not found.failing and kind != "silent_layer":
                actions.append("went on (nothing non-finite on the batch: not a precision "
                               "failure there)")
            else:
                actions.append("went on from the restored state")
        why = found.describe() if found is not None else "no batch to diagnose on"
        self._finish_trip(kind, seen, ", ".join(layers) or None, "; ".join(actions), why,
                          restored)

    def _finish_trip(self, kind: str, seen: str, layer: str | None, action: str, why: str,
                     restored: int | None) -> None:
        if restored is not None:
            action = f"restored step {restored}; {action}"
        self.model.reset_metrics()
        self._iterations = readings.iterations(self.model)  # the snapshot's count
        self._losses.reset()
        self._skipped_run = 0
        self._suspects = {}
        self._tried.append(action)
        self._record(kind, seen, layer, action, why)

    def _repair_layers(self, kind: str, found, batch) -> tuple[list[str], list[str]]:
        """Every layer the batch shows failing, on the failing state: non-finite outputs (one
        after another: moving one lets the next show), outputs that disagree with float32, and
        backward passes that overflow where no loss scale helps. Returns the layers and what
        was done."""
        if batch is None or found is None or self.config.compute_dtype == "float32":
            return [], []
        x = keras.utils.unpack_x_y_sample_weight(batch)[0]
        if self.config.policy in PURE_POLICIES:
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
        moved, actions = [], []
        scale = self._scale()
        backward_is_the_scales = self._dynamic() and kind in SCALE_KINDS
        while found.failing and found.layer and found.layer not in moved:
            if found.forward is None and backward_is_the_scales:
                break  # gradients overflowing at the floor: the floor's to lower first
            changed = cause.place_in_float32(self.model, self.config, found.layer)
            if not changed:
                break
            again = cause.probe(self.model, batch, scale)
            if again.layer == found.layer and again.failing:
                cause.undo(changed)
                break
            moved.append(found.layer)
            found = again
        disagreeing = [item.layer for item in fidelity.compare_layers(self.model, x)
                       if item.layer not in moved and item.layer not in self.config.float32.layers]
        if disagreeing:
            before = fidelity.output_gap(self.model, x)
            changed = [pair for name in disagreeing
                       for pair in cause.place_in_float32(self.model, self.config, name)]
            after = fidelity.output_gap(self.model, x)
            if changed and after < 0.9 * before:
                moved += disagreeing
            else:
                cause.undo(changed)
                actions.append(f"{', '.join(disagreeing)} disagree with float32 but moving "
                               f"them did not bring the model's output closer "
                               f"({before:.3g} -> {after:.3g}): left as they were")
        if moved:
            self._amend(tuple(moved))
            self._retrace()
            actions.insert(0, f"moved {', '.join(moved)} to float32")
        return moved, actions

    def _repair_scale(self, kind: str, batch):
        """What to do to the loss scale, decided on the failing state and done after the
        restore (which puts the snapshot's scale back): a callable, or None."""
        if not self._dynamic() or kind not in SCALE_KINDS:
            return None
        if batch is not None and kind != "scale_collapsed":
            still = cause.probe(self.model, batch, self._scale())
            if still.backward is not None and not still.failing_forward:
                lowered = self._floor_that_fits(batch)
                if lowered is not None:
                    return lambda: self._set_floor(lowered)
        fitting = self._fitting_scale() if kind == "scale_collapsed" else None
        initial = fitting if fitting is not None and fitting > self._floor \
            else self.config.loss_scale.initial_scale

        def reset() -> str:
            self._optimizer.dynamic_scale.assign(initial)
            self._optimizer.step_counter.assign(0)
            return f"loss scale reset to {initial:g}"

        return reset

    def _floor_that_fits(self, batch) -> float | None:
        """Gradients overflow float16 even at the floor (a loss in the billions): the largest
        power-of-two scale below it at which the batch's backward pass is finite, with room."""
        if not cause.probe(self.model, batch, self._floor).failing:
            return None  # it passes at the floor: a passing burst, not the floor
        for exponent in range(1, 17):
            scale = self._floor / 2.0**exponent
            if not cause.probe(self.model, batch, scale).failing:
                return scale / 2.0**_FLOOR_HEADROOM  # one batch's largest is not all batches'
        return None

    def _set_floor(self, scale: float) -> str:
        self._floor = scale
        if hasattr(self._optimizer, "floor"):
            self._optimizer.floor = scale
        self._optimizer.dynamic_scale.assign(scale)
        self._optimizer.step_counter.assign(0)
        self._retrace()
        self.config = dataclasses.replace(self.config, loss_scale=dataclasses.replace(
            self.config.loss_scale, floor=scale))
        return (f"loss scale floor lowered to {scale:g} (gradients overflow float16 at the old "
                "floor)")

    def _last_resort_left(self) -> bool:
        return self.config.policy not in PURE_POLICIES and self.config.policy != "float32"

    def _last_resort(self, why: str) -> str:
        if self._snapshot is not None:
            self._snapshot.restore(self.model)
        cause.whole_model_float32(self.model)
        self._retrace()
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
        self._record("gave_up", seen, None, "stopped the training", message)
        self._close()
        raise GuardError(message)

    def _close(self) -> None:
        self._keeper.unwrap()
        readings.log_to_mlflow(self.history, self.events, self.config)

    def _collapsed(self) -> bool:
        """Does the scale sit at its floor needlessly? It does if the batch's backward pass is
        finite at a scale 2^4 above the floor or more (``_fitting_scale``)."""
        fitting = self._fitting_scale()
        return fitting is None or fitting >= self._floor * 2.0**_FLOOR_HEADROOM

    def _fitting_scale(self) -> float | None:
        """The largest power-of-two scale up to the initial one at which the kept batch's
        backward pass is finite (bisected over the exponents; the probe's training-mode passes
        run on a copy of the state: they move statistics). None without a batch."""
        batch = self._batch()
        if batch is None:
            return None
        if self._fitted_at == self._step:
            return self._fitted
        state = Snapshot(self.model, self._step)
        low = math.floor(math.log2(self._floor))
        high = math.floor(math.log2(self.config.loss_scale.initial_scale))
        try:
            if not cause.probe(self.model, batch, 2.0**high).failing:
                low = high
            while high - low > 1:
                middle = (low + high) // 2
                if cause.probe(self.model, batch, 2.0**middle).failing:
                    high = middle
                else:
                    low = middle
        finally:
            state.restore(self.model)
        self._fitted_at, self._fitted = self._step, 2.0**low
        return self._fitted

    def _amend(self, layers: tuple[str, ...]) -> None:
        placement = self.config.float32
        new = tuple(dict.fromkeys(placement.layers + layers))
        provenance = dict(self.config.provenance)
        provenance["guard_repairs"] = [*provenance.get("guard_repairs", []), *layers]
        self.config = dataclasses.replace(
            self.config, float32=dataclasses.replace(placement, layers=new),
            provenance=provenance)
