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
from tuner.apply.guard import cause, fidelity, precision_loss, readings, scales
from tuner.apply.guard.events import GuardEvent
from tuner.apply.guard.failures import Failure, Notice
from tuner.apply.guard.repairs import Repairs
from tuner.apply.guard.state import BatchKeeper, Snapshot
from tuner.apply.guard.watch import LossSeries, Spacing, SpikeWatch
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
    consecutive skipped updates that count as a failure (of each optimizer the model holds: a
    GAN's two are watched and repaired each); ``spike_sigmas``: how many robust
    standard deviations of the recent log loss make a spike; ``check_every``: steps between
    per-layer float32 comparisons on the kept batch (also at each epoch's end; None: never);
    ``float32_check``: data (``(x, y)`` or a dataset) to evaluate on as-is and in float32
    each epoch; ``data``: a batch to diagnose on before the training's own is kept (or as well
    as it: it is used where no batch was kept); ``verbose``: 0 silences the one line per event.
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
        self._epoch = 0
        self._scales: list[scales.ScaleWatch] = []   # one per optimizer the model holds
        self._layer_checks = Spacing(self.check_every, CHECK_BUDGET)
        self._loss_checks = Spacing(self.check_every, CHECK_BUDGET)
        self._suspects: dict[str, int] = {}   # layer -> checks in a row it disagreed
        self._float32_check = precision_loss.Float32CheckWatch()
        self._loss_gap = precision_loss.LossGapWatch()
        self._found_nothing = 0
        self._tried: list[str] = []
        self._start: Snapshot | None = None
        self._settled = False   # after the last resort: a float32 training, not watched

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None) -> None:
        model = self.model
        self._keeper.wrap(model)  # fit made its train function before calling us
        readings.build_optimizer(model)   # so that the first snapshot holds its state
        self._tracker = readings.loss_tracker(model)
        self._scales = scales.watches(model, self.config.loss_scale.floor)
        self._traceable = readings.traceable(model)
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
        for watch in self._scales:
            watch.skipped_epoch = 0
        self._losses.reset()

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self._settled:
            return
        logs = logs or {}
        before = self._step
        self._step = self._epoch_base + int(batch) + 1
        steps = max(1, self._step - before)
        for watch in self._scales:
            watch.stepped(steps)
        kind, seen, watch = self._check_step(self._step_loss(logs), logs)
        if kind is None:
            kind, seen = self._check_batch(at_epoch_end=False)
        if kind is not None:
            self._trip(kind, seen, watch)
        elif self._snapshot is None or not self._snapshot.complete \
                or self._step - self._snapshot.step >= self.snapshot_every:
            self._take_snapshot()
        if self._start is not None and not self._early():
            self._start = None

    def on_epoch_end(self, epoch, logs=None) -> None:
        logs = logs or {}
        figures = {"epoch": epoch, "loss": readings.scalar(logs.get("loss")),
                   "val_loss": readings.scalar(logs.get("val_loss")),
                   **self._scale_figures()}
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
    def _check_step(self, loss: float | None, logs: dict
                    ) -> tuple[Failure | None, str, scales.ScaleWatch | None]:
        own = {} if loss is not None else {   # a train_step's own losses (a GAN's d_loss)
            name: readings.scalar(value) for name, value in logs.items() if name.endswith("loss")}
        for name, value in [("loss", loss), *own.items()]:
            if value is not None and not math.isfinite(value):
                return Failure.NON_FINITE_LOSS, f"{name} {value}", None
        for watch in self._scales:
            kind, seen = self._check_scale(watch)
            if kind is not None:
                return kind, watch.owner() + seen, watch
        if loss is not None and self._spikes.is_spike(loss):
            return Failure.LOSS_SPIKE, (f"loss {loss:.4g} above the recent level's bar "
                                        f"{self._spikes.threshold():.4g}"), None
        return None, "", None

    def _check_scale(self, watch: scales.ScaleWatch) -> tuple[Failure | None, str]:
        at_floor = watch.at_floor()
        watch.floor_steps = watch.floor_steps + 1 if at_floor else 0
        if at_floor and watch.skipped_run >= 3:
            return Failure.SCALE_AT_FLOOR, (f"loss scale {watch.scale():g} at its floor "
                                            f"{watch.floor:g} and {watch.skipped_run} updates "
                                            "skipped there")
        # Collapsed: at its floor though the kept batch fits higher.
        if at_floor and watch.floor_steps == self.max_skipped and self._batch() is not None \
                and self._collapsed(watch):
            return Failure.SCALE_COLLAPSED, (f"loss scale {watch.scale():g} at its floor for "
                                             f"{watch.floor_steps} steps, though the batch's "
                                             f"gradients fit float16 at "
                                             f"{self._fitting_scale(watch):g}")
        if watch.skipped_run >= self.max_skipped:
            return Failure.SKIPPED_UPDATES, f"{watch.skipped_run} updates skipped in a row"
        return None, ""

    def _check_batch(self, at_epoch_end: bool) -> tuple[Failure | None, str]:
        """The checks on the kept batch, each when due (``watch.Spacing``): each 16-bit layer
        against float32, then the model's loss against float32's."""
        if self._batch() is None or self.config.compute_dtype == "float32" \
                or not self._traceable:
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
        if snapshot.finite and not any(watch.skipped_run for watch in self._scales):
            self._snapshot = snapshot
            self.snapshot_bytes = snapshot.nbytes

    def _batch(self):
        batch = self._keeper.batch()
        return batch if batch is not None else self.data

    def _scale_figures(self) -> dict[str, Any]:
        """Each optimizer's loss scale and skipped steps this epoch (``loss_scale``,
        ``skipped_steps`` for ``model.optimizer``; suffixed by its name for any other)."""
        figures: dict[str, Any] = {"loss_scale": None, "skipped_steps": 0}
        for watch in (watch for watch in self._scales if watch.applied):
            suffix = "" if watch.name == "optimizer" else f"_{watch.name}"
            figures[f"loss_scale{suffix}"] = watch.scale()
            figures[f"skipped_steps{suffix}"] = watch.skipped_epoch
        return figures

    def _step_loss(self, logs: dict) -> float | None:
        total = count = None
        if self._tracker is not None:
            total = float(keras.ops.convert_to_numpy(self._tracker.total))
            count = float(keras.ops.convert_to_numpy(self._tracker.count))
        return self._losses.step_loss(total, count, readings.scalar(logs.get("loss")))
