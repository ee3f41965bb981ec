"""``PrecisionGuard``: a Keras callback that watches a training under a ``PrecisionConfig`` and,
when 16-bit training fails, restores the last good state, finds the layer at fault on the
failing batch and repairs it, then lets the training go on.

Checks, after every step: a non-finite loss; a run of skipped updates (the optimizer's
iterations not advancing under a loss scale); a dynamic loss scale at its floor; a loss far
above its recent level (``watch.SpikeWatch``). After every epoch: a non-finite validation loss,
and (``float32_check=``, off by default: it costs an evaluation) the same weights evaluated
with every layer in float32, which says what 16-bit compute costs the model now.

The repair ladder, smallest step first, each layer repair verified on the failing batch
(``cause``): restore the last snapshot; move the layer at fault to float32; reset the loss
scale when it sat at its floor; as the last resort (mixed policies) every layer to float32.
After ``max_repairs`` it stops the training with ``GuardError``, naming what it tried.
Under pure 16-bit policies (16-bit weights) a layer cannot move to float32 mid-training (its
weights and their optimizer slots are 16-bit): the guard restores and rescales, and records
the layer in ``guard.config`` so that the next training builds it in float32.

A healthy training is untouched: the guard only reads variables, and its step wrapper only
copies the batch, so the loss history is the same bit for bit (tests/test_guard.py).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import keras

from tuner.apply.config import PrecisionConfig, PURE_POLICIES
from tuner.apply.guard import cause, readings
from tuner.apply.guard.state import BatchKeeper, Snapshot
from tuner.apply.guard.watch import LossSeries, SpikeWatch
from tuner.apply.loss_scaling import FixedLossScaleOptimizer, current_loss_scale
from tuner.errors import TunerError


_FLOOR_HEADROOM = 4   # a lowered floor sits 2^4 below the scale that one batch fits


class GuardError(TunerError):
    """The guard ran out of repairs; its message says what it saw and tried."""


class PrecisionGuard(keras.callbacks.Callback):
    """Watch and repair a training under ``config``; add it to ``model.fit(callbacks=[...])``.

    ``snapshot_every``: steps between host-memory snapshots (weights and optimizer state);
    ``max_repairs``: repairs before it stops the training; ``max_skipped``: consecutive skipped
    updates that count as a failure; ``spike_sigmas``: how many robust standard deviations of
    the recent log loss make a spike; ``float32_check``: data (``(x, y)`` or a dataset) to
    evaluate on in float32 each epoch; ``data``: a batch to diagnose on where the guard cannot
    keep the training's own (XLA); ``verbose``: 0 silences the one line per event.
    """

    def __init__(self, config: PrecisionConfig, *, snapshot_every: int = 50,
                 max_repairs: int = 5, max_skipped: int = 25, spike_sigmas: float = 12.0,
                 float32_check: Any = None, data: Any = None, verbose: int = 1) -> None:
        super().__init__()
        self.config = config
        self.snapshot_every = readings.positive_int("snapshot_every", snapshot_every)
        self.max_repairs = readings.positive_int("max_repairs", max_repairs)
        self.max_skipped = readings.positive_int("max_skipped", max_skipped)
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
        self._tried: list[str] = []

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None) -> None:
        model = self.model
        readings.refuse_several_optimizers(model)
        if self._keeper.wrap(model):
            model.make_train_function(force=True)  # fit made it before calling us
        self._optimizer = model.optimizer
        self._tracker = readings.loss_tracker(model)
        self._floor = float(getattr(self._optimizer, "floor", self.config.loss_scale.floor))
        self._iterations = readings.iterations(self.model)
        self._take_snapshot()

    def on_train_end(self, logs=None) -> None:
        self._keeper.unwrap()
        readings.log_to_mlflow(self.history, self.events, self.config)

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
                                       f"fit float16 at {self.config.loss_scale.initial_scale:g}")
        if self._skipped_run >= self.max_skipped:
            return "skipped_updates", f"{self._skipped_run} updates skipped in a row"
        if loss is not None and self._spikes.is_spike(loss):
            return "loss_spike", (f"loss {loss:.4g} above the recent level's bar "
                                  f"{self._spikes.threshold():.4g}")
        return None, ""

    # -- repairing ---------------------------------------------------------------------------
    def _trip(self, kind: str, seen: str) -> None:
        if self.repairs >= self.max_repairs:
            self.model.stop_training = True
            raise GuardError(
                f"precision guard: {seen} at epoch {self._epoch + 1} step {self._step} after "
                f"{self.repairs} repairs (tried: {'; '.join(self._tried) or 'nothing'}); "
                "stopping. Train with guard.config, or in float32.")
        self.repairs += 1
        model, batch = self.model, self._batch()
        restored = self._snapshot.step if self._snapshot else None
        broken = readings.non_finite_weights(model)
        if broken and self._snapshot is not None:  # diagnose on the state that was still good
            self._snapshot.restore(model)
        found = cause.probe(model, batch, self._scale()) if batch is not None else None
        if self._snapshot is not None:
            self._snapshot.restore(model)
        if found is not None and found.data_non_finite:
            action = f"restored step {restored}; skipped a batch holding NaN/inf (not precision)"
        else:
            action = self._repair(kind, found, batch)
            action = f"restored step {restored}; {action}" if restored is not None else action
        model.reset_metrics()
        self._iterations = readings.iterations(self.model)  # the snapshot's count
        self._losses.reset()
        self._skipped_run = 0
        self._tried.append(action)
        self._record(kind, seen, found.layer if found else None, action,
                     found.describe() if found else "no batch to diagnose on")

    def _repair(self, kind: str, found, batch) -> str:
        layer = found.layer if found is not None else None
        if layer is not None and self.config.compute_dtype != "float32":
            if self.config.policy in PURE_POLICIES:
                self._amend(layers=(layer,))
                return (f"cannot move {layer} to float32 mid-training under pure "
                        f"{self.config.policy} (its weights are 16-bit): guard.config builds "
                        "it in float32 next time")
            changed = cause.place_in_float32(self.model, self.config, layer)
            if changed and not cause.probe(self.model, batch, self._scale()).failing:
                self._amend(layers=(layer,))
                cause.retrace(self.model)
                return f"moved {layer} to float32"
            cause.undo(changed)
        if self._dynamic() and kind in ("scale_at_floor", "skipped_updates") \
                and found is not None and found.backward is not None:
            lowered = self._lower_floor(batch)
            if lowered is not None:
                return lowered
        if self._dynamic() and kind in ("scale_at_floor", "scale_collapsed", "skipped_updates"):
            initial = self.config.loss_scale.initial_scale
            self._optimizer.dynamic_scale.assign(initial)
            self._optimizer.step_counter.assign(0)
            return f"loss scale reset to {initial:g}"
        if found is not None and not found.failing:
            return "went on (nothing non-finite on the batch: not a precision failure there)"
        if self.repairs >= 2 and self.config.policy not in PURE_POLICIES \
                and self.config.policy != "float32":
            cause.whole_model_float32(self.model)
            cause.retrace(self.model)
            self.config = dataclasses.replace(self.config, policy="float32",
                                              loss_scale=type(self.config.loss_scale)(),
                                              weight_update="nearest")
            return "every layer to float32 (last resort)"
        return "went on from the restored state"

    def _collapsed(self) -> bool:
        """Does the scale sit at its floor needlessly? The batch's backward pass at the initial
        scale says (on a copy of the state: the probe's training-mode pass moves statistics)."""
        batch = self._batch()
        if batch is None:
            return True
        state = Snapshot(self.model, self._step)
        try:
            return not cause.probe(self.model, batch, self.config.loss_scale.initial_scale).failing
        finally:
            state.restore(self.model)

    def _lower_floor(self, batch) -> str | None:
        """Gradients overflow float16 even at the floor (a loss in the billions): find the
        largest power-of-two scale below it at which the batch's backward pass is finite."""
        for exponent in range(1, 17):
            scale = self._floor / 2.0**exponent
            if not cause.probe(self.model, batch, scale).failing:
                if not cause.probe(self.model, batch, self._floor).failing:
                    return None  # it passed at the floor too: a passing burst, not the floor
                scale /= 2.0**_FLOOR_HEADROOM  # one batch's largest gradient is not all batches'
                self._floor = scale
                if hasattr(self._optimizer, "floor"):
                    self._optimizer.floor = scale
                self._optimizer.dynamic_scale.assign(scale)
                self._optimizer.step_counter.assign(0)
                cause.retrace(self.model)
                self.config = dataclasses.replace(self.config, loss_scale=dataclasses.replace(
                    self.config.loss_scale, floor=scale))
                return (f"loss scale floor lowered to {scale:g} (gradients overflow float16 at "
                        "the old floor)")
        return "went on from the restored state (no loss scale down to 2^-16 keeps it finite)"

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
    def _take_snapshot(self) -> None:
        self._snapshot = Snapshot(self.model, self._step)
        self.snapshot_bytes = self._snapshot.nbytes

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
