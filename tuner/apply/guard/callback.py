"""``PrecisionGuard``: a Keras callback that watches a training under a ``PrecisionConfig`` and
repairs what fails on the failing batch, then lets the training go on.

Checks (each failure a kind of ``failures.Failure``), after every step: a non-finite loss; a
run of skipped updates (the optimizer's iterations not advancing under a loss scale); a dynamic
loss scale at its floor; a loss far above its recent level (``watch.SpikeWatch``). Every
``check_every`` steps and at each epoch's end, spaced to take at most ``CHECK_BUDGET`` of the
training's time: each 16-bit layer's output against the same layer computed in float32 on the
kept batch (``fidelity``: a finite, wrong output that no NaN ever shows); a layer broken on half
the batch, or beyond any rounding at two checks in a row, is a failure; then the kept batch's
loss as the model runs against the same weights in float32 (``precision_loss``: rounding that
costs the model what it learns, with every layer's own output within 1%). After every epoch: a
non-finite validation loss, and (``float32_check=``, off by default: it costs two evaluations)
the same judgement on the check's data.

A repair is one trip, sized by what the failing batch shows (``repairs``): restore the last
snapshot, move every layer the batch shows at fault (non-finite, disagreeing with float32, or
overflowing backward even at the loss scale's floor), and for a precision failure those do not
bring back the smallest set of layers whose float32 does (``float32_set``); lower the floor or
reset a collapsed scale. A precision failure in the training's first ``EARLY`` share restarts
it from its start. The last resort (mixed policies: every layer in float32) ends the watch;
under pure 16-bit policies, where layers cannot move mid-training (the guard records them in
``guard.config`` for next time), running out of repairs raises ``GuardError``. A config whose
dtype reaches (almost) no layer is an event at the start.

A healthy training is untouched: the guard reads variables, runs inference-mode passes on a
batch it keeps by reference, and calls Keras's own compiled step (XLA included), so the loss
history is the same bit for bit (tests/guard/test_guard.py).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Sequence

import keras

from tuner.apply.config_data import ConfigData
from tuner.apply.guard import cause, fidelity, precision_loss, readings
from tuner.apply.guard.events import GuardEvent
from tuner.apply.guard.failures import Failure, Notice
from tuner.apply.guard.repairs import Repairs
from tuner.apply.guard.state import BatchKeeper, Snapshot
from tuner.apply.guard.watch import LossSeries, Spacing, SpikeWatch
from tuner.apply.loss_scaling import current_loss_scale, loss_scale_kind
from tuner.apply.reach import unreached_model
from tuner.errors import GuardError

__all__ = ["GuardError", "PrecisionGuard"]   # GuardError is raised from .repairs


# The share of training time each check on the kept batch (the per-layer float32 comparison,
# the loss against float32's) may take: checks are spaced out to keep within it.
CHECK_BUDGET = 0.02
# A precision failure found within this share of the training restarts it from its start: the
# weights learned so far learned to live with the rounding (and the start is kept till then).
EARLY = 0.25


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
        self.events: list[GuardEvent] = []
        self.history: list[dict[str, Any]] = []   # per-epoch figures
        self.repairs = 0
        self.snapshot_bytes = 0
        self._keeper = BatchKeeper()
        self._spikes = SpikeWatch(sigmas=self.spike_sigmas)
        self._losses = LossSeries()
        self._snapshot: Snapshot | None = None
        self._step = self._epoch_base = 0   # steps trained in this fit, before this epoch
        self._epoch = self._iterations = self._skipped_run = 0
        self._skipped_epoch = self._floor_steps = 0
        self._layer_checks = Spacing(self.check_every, CHECK_BUDGET)
        self._loss_checks = Spacing(self.check_every, CHECK_BUDGET)
        self._suspects: dict[str, int] = {}   # layer -> checks in a row it disagreed
        self._float32_check = precision_loss.Float32CheckWatch()
        self._loss_gap = precision_loss.LossGapWatch()
        self._found_nothing = 0
        self._fitted_at, self._fitted = -1, None   # _fitting_scale's answer at a step
        self._tried: list[str] = []
        self._start: Snapshot | None = None
        self._settled = False   # after the last resort: a float32 training, not watched

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
        self._start = self._snapshot   # kept through the training's first EARLY share
        unreached = unreached_model(model, self.config.policy)
        if unreached:  # nothing to guard: say why, as the tuner's trial does
            self._record(Notice.PRECISION_UNREACHED, unreached, (), "nothing to repair",
                         "no 16-bit layer")

    def on_train_end(self, logs=None) -> None:
        self._close()

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._epoch = epoch
        self._epoch_base = self._step
        self._skipped_epoch = 0
        self._losses.reset()

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self._settled:
            return
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
        if kind is None:
            kind, seen = self._check_batch(at_epoch_end=False)
        if kind is not None:
            self._trip(kind, seen)
        elif self._snapshot is None or not self._snapshot.complete \
                or self._step - self._snapshot.step >= self.snapshot_every:
            self._take_snapshot()
        if self._start is not None and not self._early():
            self._start = None

    def on_epoch_end(self, epoch, logs=None) -> None:
        logs = logs or {}
        figures = {"epoch": epoch, "loss": readings.scalar(logs.get("loss")),
                   "val_loss": readings.scalar(logs.get("val_loss")),
                   "loss_scale": self._scale(), "skipped_steps": self._skipped_epoch}
        if self.float32_check is not None:
            figures.update(readings.evaluate_as_is_and_in_float32(self.model,
                                                                  self.float32_check))
        self.history.append(figures)
        if self._settled:
            return
        val = figures["val_loss"]
        if val is not None and not math.isfinite(val):
            self._trip(Failure.VAL_NON_FINITE, f"validation loss {val}")
            return
        if self.float32_check is not None:
            seen = self._float32_check.judge(figures["check_loss"], figures["check_loss_float32"])
            if seen is not None:
                self._trip(Failure.FLOAT32_GAP, seen)
                return
        kind, seen = self._check_batch(at_epoch_end=True)
        if kind is not None:
            self._trip(kind, seen)

    def _early(self) -> bool:
        """Within the first ``EARLY`` of the training's steps (the first epoch where fit does
        not know how many steps an epoch has)."""
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        if not epochs or not steps:
            return self._epoch == 0
        return self._step <= EARLY * epochs * steps

    # -- checks ------------------------------------------------------------------------------
    def _check_step(self, loss: float | None) -> tuple[Failure | None, str]:
        if loss is not None and not math.isfinite(loss):
            return Failure.NON_FINITE_LOSS, f"loss {loss}"
        scale = self._scale()
        at_floor = scale is not None and self._dynamic() and scale <= self._floor
        self._floor_steps = self._floor_steps + 1 if at_floor else 0
        if at_floor and self._skipped_run >= 3:
            return Failure.SCALE_AT_FLOOR, (f"loss scale {scale:g} at its floor {self._floor:g} "
                                            f"and {self._skipped_run} updates skipped there")
        # Collapsed: at its floor though the kept batch fits higher (none under tf.distribute).
        if at_floor and self._floor_steps == self.max_skipped and self._batch() is not None \
                and self._collapsed():
            return Failure.SCALE_COLLAPSED, (f"loss scale {scale:g} at its floor for "
                                             f"{self._floor_steps} steps, though the batch's "
                                             f"gradients fit float16 at {self._fitting_scale():g}")
        if self._skipped_run >= self.max_skipped:
            return Failure.SKIPPED_UPDATES, f"{self._skipped_run} updates skipped in a row"
        if loss is not None and self._spikes.is_spike(loss):
            return Failure.LOSS_SPIKE, (f"loss {loss:.4g} above the recent level's bar "
                                        f"{self._spikes.threshold():.4g}")
        return None, ""

    def _check_batch(self, at_epoch_end: bool) -> tuple[Failure | None, str]:
        """The checks on the kept batch, each when due (``watch.Spacing``): each 16-bit layer
        against float32, then the model's loss against float32's."""
        if self._batch() is None or self.config.compute_dtype == "float32":
            return None, ""
        for spacing, check in ((self._layer_checks, self._compare_layers),
                               (self._loss_checks, self._compare_loss)):
            started = time.perf_counter()
            if spacing.due(self._step, at_epoch_end, started):
                try:
                    kind, seen = check(self._batch())
                finally:
                    spacing.ran(self._step, started, time.perf_counter())
                if kind is not None:
                    return kind, seen
        return None, ""

    def _compare_layers(self, batch) -> tuple[Failure | None, str]:
        """A layer broken on at least half the batch, or beyond any rounding at two checks in
        a row, is a silent failure."""
        x = keras.utils.unpack_x_y_sample_weight(batch)[0]
        found = [item for item in fidelity.compare_layers(self.model, x)
                 if item.layer not in self.config.float32.layers]
        self._suspects = {item.layer: self._suspects.get(item.layer, 0) + 1 for item in found}
        lasting = [item for item in found
                   if item.broken >= 0.5 or self._suspects[item.layer] >= 2]
        if lasting:
            return Failure.SILENT_LAYER, "; ".join(item.describe() for item in lasting)
        return None, ""

    def _compare_loss(self, batch) -> tuple[Failure | None, str]:
        seen = self._loss_gap.check(self.model, batch)
        return (Failure.PRECISION_LOSS, seen) if seen else (None, "")

    # -- repairing ---------------------------------------------------------------------------
    def _record(self, kind: str, seen: str, layers: Sequence[str], action: str,
                why: str) -> None:
        event = GuardEvent(self._epoch + 1, self._step, kind, seen, tuple(layers), why, action)
        self.events.append(event)
        if self.verbose:
            print(f"\n{event.line()}", file=sys.stderr, flush=True)

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
