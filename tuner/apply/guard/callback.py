"""``PrecisionGuard``: a Keras callback that watches a training under a ``PrecisionConfig`` and,
when 16-bit training fails, restores the last good state, finds the layers at fault on the
failing batch and repairs them, then lets the training go on.

Checks, after every step: a non-finite loss; a run of skipped updates (the optimizer's
iterations not advancing under a loss scale); a dynamic loss scale at its floor; a loss far
above its recent level (``watch.SpikeWatch``). Every ``check_every`` steps and at each epoch's
end, spaced to take at most ``CHECK_BUDGET`` of the training's time: each 16-bit layer's
output against the same layer computed in float32 on the kept batch (``fidelity``: a finite,
wrong output that no NaN ever shows); a layer broken on half the batch, or beyond any rounding
at two checks in a row, is a failure. After every epoch: a non-finite validation loss, and
(``float32_check=``, off by default: it costs two evaluations) the same weights evaluated with
every layer in float32; a gap beyond ``FLOAT32_GAP`` two epochs running is a failure.

A repair is one trip, sized by what the failing batch shows (``repairs``): restore the last
snapshot; move every layer whose output is non-finite, every layer that disagrees with
float32, and every layer whose backward pass overflows even at the loss scale's floor (unless
that would take most of the model), each verified on the batch (``cause``, ``fidelity``);
lower the floor (or a fixed scale) where gradients still overflow at it, or reset a scale that
sat at its floor needlessly. When ``max_repairs`` trips are spent, or a failure shows
nothing to repair twice, the last resort under mixed policies is every layer in float32; only
after it (or under pure 16-bit policies, where it does not exist) does the guard stop the
training with ``GuardError``. Under pure 16-bit policies (16-bit weights) a layer cannot move to
float32 mid-training (its weights and their optimizer slots are 16-bit): the guard restores and
rescales, and records the layer in ``guard.config`` so that the next training builds it in
float32. A config whose dtype reaches (almost) no layer is an event at the start (reach).

A healthy training is untouched: the guard reads variables, runs inference-mode passes on a
batch it keeps by reference, and calls Keras's own compiled step (XLA included), so the loss
history is the same bit for bit (tests/guard/test_guard.py).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import keras

from tuner.apply.config_data import ConfigData
from tuner.apply.guard import cause, fidelity, readings
from tuner.apply.guard.repairs import GuardError, Repairs
from tuner.apply.guard.state import BatchKeeper, Snapshot
from tuner.apply.guard.watch import LossSeries, SpikeWatch
from tuner.apply.loss_scaling import current_loss_scale, loss_scale_kind
from tuner.apply.reach import unreached_model


__all__ = ["GuardError", "PrecisionGuard"]   # GuardError is raised from .repairs


# The share of training time the per-layer float32 comparison may take (checks are spaced
# out to keep within it).
CHECK_BUDGET = 0.02
# The float32 check's gap (as-is loss against all-float32 loss, either way round) that counts
# as a failure when it holds two epochs running: the confirmation's level allowance (25%).
FLOAT32_GAP = 1.25


class PrecisionGuard(Repairs, keras.callbacks.Callback):
    """Watch and repair a training under ``config``; add it to ``model.fit(callbacks=[...])``.

    ``snapshot_every``: steps between host-memory snapshots (weights and optimizer state);
    ``max_repairs``: repairs before the last resort, then ``GuardError``; ``max_skipped``:
    consecutive skipped updates that count as a failure; ``spike_sigmas``: how many robust
    standard deviations of the recent log loss make a spike; ``check_every``: steps between
    per-layer float32 comparisons on the kept batch (also at each epoch's end; None: never);
    ``float32_check``: data (``(x, y)`` or a dataset) to evaluate on as-is and in float32
    each epoch; ``data``: a batch to diagnose on where the guard cannot keep the training's
    own (a distributed iterator; refused under ``tf.distribute``, where no layer is
    diagnosed); ``verbose``: 0 silences the one line per event.
    """

    def __init__(self, config: ConfigData, *, snapshot_every: int = 50,
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
        self._last_check_time = 0.0
        self._check_seconds = 0.0   # what the last comparison took
        self._suspects: dict[str, int] = {}   # layer -> checks in a row it disagreed
        self._gap_epochs = 0                  # epochs in a row the float32 check was off
        self._found_nothing = 0
        self._fitted_at, self._fitted = -1, None   # _fitting_scale's answer at a step
        self._tried: list[str] = []

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None) -> None:
        model = self.model
        readings.refuse_several_optimizers(model)
        readings.refuse_data_under_distribution(model, self.data)
        self._keeper.wrap(model)  # fit made its train function before calling us
        self._optimizer = model.optimizer
        if not self._optimizer.built and model.built and model.trainable_variables:
            # As Keras builds it for a model it builds itself: the first snapshot then holds the
            # optimizer's state too (else the snapshot after the first step does).
            self._optimizer.build(model.trainable_variables)
        self._tracker = readings.loss_tracker(model)
        # Keras's own LossScaleOptimizer has no floor: its scale backs off as far as needed.
        self._floor = float(getattr(self._optimizer, "floor", 2.0**-24 if self._scaled()
                                    else self.config.loss_scale.floor))
        self._iterations = readings.iterations(self.model)
        self._take_snapshot()
        unreached = unreached_model(model, self.config.policy)
        if unreached:  # nothing to guard: say why, as the tuner's trial does
            self._record("precision_unreached", unreached, None, "nothing to repair", "no 16-bit layer")

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
        if kind is None and self._check_due(at_epoch_end=False):
            kind, seen = self._check_layers()
        if kind is not None:
            self._trip(kind, seen)
        elif self._snapshot is None or not self._snapshot.complete \
                or self._step - self._snapshot.step >= self.snapshot_every:
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
        if self._check_due(at_epoch_end=True):
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
        # Collapsed: at its floor though the kept batch fits higher (none under tf.distribute).
        if at_floor and self._floor_steps == self.max_skipped and self._batch() is not None \
                and self._collapsed():
            return "scale_collapsed", (f"loss scale {scale:g} at its floor for "
                                       f"{self._floor_steps} steps, though the batch's gradients "
                                       f"fit float16 at {self._fitting_scale():g}")
        if self._skipped_run >= self.max_skipped:
            return "skipped_updates", f"{self._skipped_run} updates skipped in a row"
        if loss is not None and self._spikes.is_spike(loss):
            return "loss_spike", (f"loss {loss:.4g} above the recent level's bar "
                                  f"{self._spikes.threshold():.4g}")
        return None, ""

    def _check_due(self, at_epoch_end: bool) -> bool:
        """Every ``check_every`` steps and at each epoch's end, within the cost budget: the
        comparison never takes more than ``CHECK_BUDGET`` of the time since the last one (a
        tiny model's epochs last less than a check)."""
        if self.check_every is None or self._step == self._last_check:
            return False
        if time.perf_counter() - self._last_check_time < self._check_seconds / CHECK_BUDGET:
            return False
        return at_epoch_end or self._step - self._last_check >= self.check_every

    def _check_layers(self) -> tuple[str | None, str]:
        """The per-layer float32 comparison on the kept batch: a layer broken on at least half
        the batch, or beyond any rounding at two checks in a row, is a silent failure."""
        started = time.perf_counter()
        try:
            return self._compare_layers()
        finally:
            self._last_check, self._last_check_time = self._step, time.perf_counter()
            self._check_seconds = self._last_check_time - started

    def _compare_layers(self) -> tuple[str | None, str]:
        batch = self._batch()
        if batch is None or self.config.compute_dtype == "float32":
            return None, ""
        x = keras.utils.unpack_x_y_sample_weight(batch)[0]
        found = [item for item in fidelity.compare_layers(self.model, x)
                 if item.layer not in self.config.float32.layers]
        self._suspects = {item.layer: self._suspects.get(item.layer, 0) + 1 for item in found}
        lasting = [item for item in found
                   if item.broken >= 0.5 or self._suspects[item.layer] >= 2]
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
        return loss_scale_kind(self._optimizer).scales

    def _dynamic(self) -> bool:
        return loss_scale_kind(self._optimizer).moves

    def _scale(self) -> float | None:
        return current_loss_scale(self._optimizer)

    def _step_loss(self, logs: dict) -> float | None:
        total = count = None
        if self._tracker is not None:
            total = float(keras.ops.convert_to_numpy(self._tracker.total))
            count = float(keras.ops.convert_to_numpy(self._tracker.count))
        return self._losses.step_loss(total, count, readings.scalar(logs.get("loss")))
