"""``PrecisionGuard``: a Keras callback that watches a training under a ``PrecisionConfig`` and,
when 16-bit training fails, restores the last good state, finds the layers at fault on the
failing batch and repairs them, then lets the training go on.

Checks, after every step: a non-finite loss; a run of skipped updates (the optimizer's
iterations not advancing under a loss scale); a dynamic loss scale at its floor; a loss far
above its recent level (``watch.SpikeWatch``). Every ``check_every`` steps and at each epoch's
end: each 16-bit layer's output against the same layer computed in float32 on the kept batch
(``fidelity``: a finite, wrong output that no NaN ever shows), a layer beyond any rounding at
two checks in a row is a failure. After every epoch: a non-finite validation loss, and
(``float32_check=``, off by default: it costs two evaluations) the same weights evaluated with
every layer in float32; a gap beyond ``FLOAT32_GAP`` two epochs running is a failure.

A repair is one trip, sized by what the failing batch shows: restore the last snapshot; move
every layer whose output is non-finite, every layer whose backward pass overflows where no
loss scale helps, and every layer that disagrees with float32, each verified on the batch
(``cause``, ``fidelity``); lower the loss-scale floor where gradients overflow even at it, or
reset a scale that sat at its floor. When ``max_repairs`` trips are spent, or a failure shows
nothing to repair twice, the last resort under mixed policies is every layer in float32; only
after it (or under pure 16-bit policies, where it does not exist) does the guard stop the
training with ``GuardError``. Under pure 16-bit policies (16-bit weights) a layer cannot move to
float32 mid-training (its weights and their optimizer slots are 16-bit): the guard restores and
rescales, and records the layer in ``guard.config`` so that the next training builds it in
float32.

A healthy training is untouched: the guard reads variables, runs inference-mode passes on a
batch it keeps by reference, and calls Keras's own compiled step (XLA included), so the loss
history is the same bit for bit (tests/guard/test_guard.py).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import keras

from tuner.apply.config import PrecisionConfig, PURE_POLICIES
from tuner.apply.guard import cause, fidelity, readings
from tuner.apply.guard.state import BatchKeeper, Snapshot
from tuner.apply.guard.watch import LossSeries, SpikeWatch
from tuner.apply.loss_scaling import FixedLossScaleOptimizer, current_loss_scale
from tuner.errors import TunerError


_FLOOR_HEADROOM = 4   # a lowered floor sits 2^4 below the scale that one batch fits
# The float32 check's gap (as-is loss against all-float32 loss, either way round) that counts
# as a failure when it holds two epochs running: the confirmation's level allowance (25%).
FLOAT32_GAP = 1.25
_SCALE_KINDS = ("scale_at_floor", "scale_collapsed", "skipped_updates")


class GuardError(TunerError):
    """The guard ran out of repairs; its message says what it saw and tried."""


class PrecisionGuard(keras.callbacks.Callback):
    """Watch and repair a training under ``config``; add it to ``model.fit(callbacks=[...])``.

    ``snapshot_every``: steps between host-memory snapshots (weights and optimizer state);
    ``max_repairs``: repairs before the last resort, then ``GuardError``; ``max_skipped``:
    consecutive skipped updates that count as a failure; ``spike_sigmas``: how many robust
    standard deviations of the recent log loss make a spike; ``check_every``: steps between
    per-layer float32 comparisons on the kept batch (also at each epoch's end; None: never);
    ``float32_check``: data (``(x, y)`` or a dataset) to evaluate on as-is and in float32
    each epoch; ``data``: a batch to diagnose on where the guard cannot keep the training's
    own (a distributed iterator); ``verbose``: 0 silences the one line per event.
    """

    def __init__(self, config: PrecisionConfig, *, snapshot_every: int = 50,
                 max_repairs: int = 5, max_skipped: int = 25, spike_sigmas: float = 12.0,
                 check_every: int | None = 200, float32_check: Any = None, data: Any = None,
                 verbose: int = 1) -> None:
        super().__init__()
        self.config = config
        self.snapshot_every = readings.positive_int("snapshot_every", snapshot_every)
        self.max_repairs = readings.positive_int("max_repairs", max_repairs)
        self.max_skipped = readings.positive_int("max_skipped", max_skipped)
        self.check_every = None if check_every is None else \
            readings.positive_int("check_every", check_every)
        self.spike_sigmas = float(spike_sigmas)
        self.float32_check = float32_check
        self.data = data
        self.verbose = verbose
        self.events: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []   # per-epoch figures
        self.repairs = 0
        self.snapshot_bytes = 0
        self._keeper = BatchKeeper()
        self._spikes = SpikeWatch(sigmas=self.spike_sigmas)
        self._losses = LossSeries()
        self._snapshot: Snapshot | None = None
        self._step = 0               # steps trained in this fit
        self._epoch_base = 0         # steps before this epoch
        self._epoch = 0
        self._iterations = 0
        self._skipped_run = 0
        self._skipped_epoch = 0
        self._floor_steps = 0
        self._last_check = 0
        self._suspects: dict[str, int] = {}   # layer -> checks in a row it disagreed
        self._gap_epochs = 0                  # epochs in a row the float32 check was off
        self._found_nothing = 0
        self._fitted_at, self._fitted = -1, None   # _fitting_scale's answer at a step
        self._tried: list[str] = []

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None) -> None:
        model = self.model
        readings.refuse_several_optimizers(model)
        self._keeper.wrap(model)  # fit made its train function before calling us
        self._optimizer = model.optimizer
        self._tracker = readings.loss_tracker(model)
        self._floor = float(getattr(self._optimizer, "floor", self.config.loss_scale.floor))
        self._iterations = readings.iterations(self.model)
        self._take_snapshot()

    def on_train_end(self, logs=None) -> None:
        self._close()

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._epoch = epoch
        self._epoch_base = self._step
        self._skipped_epoch = 0
        self._losses.reset()

    def on_train_batch_end(self, batch, logs=None) -> None:
        logs = logs or {}
        before = self._step
        self._step = self._epoch_base + int(batch) + 1
        steps = max(1, self._step - before)
        iterations = readings.iterations(self.model)
        applied = iterations - self._iterations
        self._iterations = iterations
        skipped = max(0, steps - applied) if self._scaled() else 0
        self._skipped_epoch += skipped
        self._skipped_run = self._skipped_run + skipped if skipped else 0
        loss = self._step_loss(logs)
        kind, seen = self._check_step(loss)
        if kind is None and self.check_every is not None \
                and self._step - self._last_check >= self.check_every:
            kind, seen = self._check_layers()
        if kind is not None:
            self._trip(kind, seen)
        elif self._step - (self._snapshot.step if self._snapshot else 0) >= self.snapshot_every:
            self._take_snapshot()

    def on_epoch_end(self, epoch, logs=None) -> None:
        logs = logs or {}
        figures = {"epoch": epoch, "loss": readings.scalar(logs.get("loss")),
                   "val_loss": readings.scalar(logs.get("val_loss")),
                   "loss_scale": self._scale(), "skipped_steps": self._skipped_epoch}
        if self.float32_check is not None:
            figures.update(readings.evaluate_as_is_and_in_float32(self.model,
                                                                  self.float32_check))
        self.history.append(figures)
        val = figures["val_loss"]
        if val is not None and not math.isfinite(val):
            self._trip("val_non_finite", f"validation loss {val}")
            return
        if self.float32_check is not None:
            kind, seen = self._judge_float32_check(figures)
            if kind is not None:
                self._trip(kind, seen)
                return
        if self.check_every is not None and self._step > self._last_check:
            kind, seen = self._check_layers()
            if kind is not None:
                self._trip(kind, seen)

    # -- checks ------------------------------------------------------------------------------
    def _check_step(self, loss: float | None) -> tuple[str | None, str]:
        if loss is not None and not math.isfinite(loss):
            return "non_finite_loss", f"loss {loss}"
        scale = self._scale()
        at_floor = scale is not None and self._dynamic() and scale <= self._floor
        self._floor_steps = self._floor_steps + 1 if at_floor else 0
        if at_floor and self._skipped_run >= 3:
            return "scale_at_floor", (f"loss scale {scale:g} at its floor {self._floor:g} and "
                                      f"{self._skipped_run} updates skipped there")
        if at_floor and self._floor_steps == self.max_skipped and self._collapsed():
            return "scale_collapsed", (f"loss scale {scale:g} at its floor for "
                                       f"{self._floor_steps} steps, though the batch's gradients "
                                       f"fit float16 at {self._fitting_scale():g}")
        if self._skipped_run >= self.max_skipped:
            return "skipped_updates", f"{self._skipped_run} updates skipped in a row"
        if loss is not None and self._spikes.is_spike(loss):
            return "loss_spike", (f"loss {loss:.4g} above the recent level's bar "
                                  f"{self._spikes.threshold():.4g}")
        return None, ""

    def _check_layers(self) -> tuple[str | None, str]:
        """The per-layer float32 comparison on the kept batch: a layer beyond any rounding at
        two checks in a row is a silent failure."""
        self._last_check = self._step
        batch = self._batch()
        if batch is None or self.config.compute_dtype == "float32":
            return None, ""
        x = keras.utils.unpack_x_y_sample_weight(batch)[0]
        found = [item for item in fidelity.compare_layers(self.model, x)
                 if item.layer not in self.config.float32.layers]
        self._suspects = {item.layer: self._suspects.get(item.layer, 0) + 1 for item in found}
        lasting = [item for item in found if self._suspects[item.layer] >= 2]
        if not lasting:
            return None, ""
        return "silent_layer", "; ".join(item.describe() for item in lasting)

    def _judge_float32_check(self, figures: dict) -> tuple[str | None, str]:
        as_is, in_float32 = figures["check_loss"], figures["check_loss_float32"]
        if not (math.isfinite(in_float32) and in_float32 > 0):
            self._gap_epochs = 0
            return None, ""
        gap = max(as_is / in_float32, in_float32 / as_is) if math.isfinite(as_is) \
            and as_is > 0 else math.inf
        self._gap_epochs = self._gap_epochs + 1 if gap > FLOAT32_GAP else 0
        if self._gap_epochs < 2:
            return None, ""
        self._gap_epochs = 0
        return "float32_gap", (f"the float32 check's loss is {as_is:.4g} as the model runs and "
                               f"{in_float32:.4g} with every layer in float32 ({gap:.3g}x "
                               f"apart, two epochs running; allowed {FLOAT32_GAP:g}x)")

    # -- repairing ---------------------------------------------------------------------------
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
        backward_is_the_scales = self._dynamic() and kind in _SCALE_KINDS
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
        if not self._dynamic() or kind not in _SCALE_KINDS:
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
        return f"loss scale floor lowered to {scale:g} (gradients overflow float16 at the old floor)"

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

    def _record(self, kind: str, seen: str, layer: str | None, action: str, why: str) -> None:
        event = {"epoch": self._epoch + 1, "step": self._step, "kind": kind, "seen": seen,
                 "layer": layer, "cause": why, "action": action}
        self.events.append(event)
        if self.verbose:
            print(f"\nprecision guard: epoch {event['epoch']} step {event['step']}: {seen} "
                  f"[{kind}]; cause: {why}; {action}", file=sys.stderr, flush=True)

    # -- reading the training ----------------------------------------------------------------
    def _retrace(self) -> None:
        cause.retrace(self.model)
        self._keeper.rewrap()

    def _take_snapshot(self) -> None:
        snapshot = Snapshot(self.model, self._step)
        if snapshot.finite and self._skipped_run == 0:
            self._snapshot = snapshot
            self.snapshot_bytes = snapshot.nbytes

    def _batch(self):
        batch = self._keeper.batch()
        return batch if batch is not None else self.data

    def _scaled(self) -> bool:
        return isinstance(self._optimizer, keras.optimizers.LossScaleOptimizer)

    def _dynamic(self) -> bool:
        return self._scaled() and not isinstance(self._optimizer, FixedLossScaleOptimizer)

    def _scale(self) -> float | None:
        return current_loss_scale(self._optimizer)

    def _step_loss(self, logs: dict) -> float | None:
        total = count = None
        if self._tracker is not None:
            total = float(keras.ops.convert_to_numpy(self._tracker.total))
            count = float(keras.ops.convert_to_numpy(self._tracker.count))
        return self._losses.step_loss(total, count, readings.scalar(logs.get("loss")))
