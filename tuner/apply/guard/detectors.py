"""The guard's detectors: each answers one question after a step or after an epoch, "did the
training fail, and what did it show?", with a ``Finding`` (a ``failures.Failure`` and what was
seen) or None. The callback asks them in order and hands the first finding to the repair
ladder (``ladder``); after a trip each forgets what the restored steps showed (``after_trip``).

A new kind of failure is one detector here, one ``Failure`` and one line in the callback's
lists.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import keras

from tuner.apply.guard import fidelity, precision_loss, readings
from tuner.apply.guard.failures import Failure
from tuner.apply.guard.scales import ScaleWatch
from tuner.apply.guard.training import Training
from tuner.apply.guard.watch import Spacing, SpikeWatch


@dataclass(frozen=True)
class Finding:
    """A failure a detector saw: its kind, what it saw (one phrase for the event), and the
    optimizer whose loss scale failed where it is one of several."""

    kind: Failure
    seen: str
    watch: ScaleWatch | None = None


@dataclass(frozen=True)
class StepReading:
    """What a training step left to read: its loss (None where the model reports none of its
    own, as a GAN's ``train_step``) and Keras's logs."""

    loss: float | None
    logs: dict


class Detector:
    """One check of the training; each method returns a ``Finding`` or None."""

    def after_step(self, training: Training, step: StepReading) -> Finding | None:
        return None

    def after_epoch(self, training: Training, figures: dict[str, Any]) -> Finding | None:
        return None

    def after_trip(self, restored: bool) -> None:
        """A repair happened (``restored``: the weights went back to a snapshot)."""


class NonFiniteLoss(Detector):
    """A step's loss, or any loss a model's own ``train_step`` logs (a GAN's ``d_loss``), is
    NaN or inf."""

    def after_step(self, training: Training, step: StepReading) -> Finding | None:
        own = {} if step.loss is not None else {
            name: readings.scalar(value) for name, value in step.logs.items()
            if name.endswith("loss")}
        for name, value in [("loss", step.loss), *own.items()]:
            if value is not None and not math.isfinite(value):
                return Finding(Failure.NON_FINITE_LOSS, f"{name} {value}")
        return None


class LossScales(Detector):
    """Each optimizer's loss scale: at its floor while updates are still skipped there; at its
    floor for ``max_skipped`` steps though the kept batch fits higher (collapsed); or
    ``max_skipped`` updates skipped in a row."""

    def __init__(self, max_skipped: int) -> None:
        self.max_skipped = max_skipped

    def after_step(self, training: Training, step: StepReading) -> Finding | None:
        for watch in training.scales:
            found = self._check(training, watch)
            if found is not None:
                return Finding(found.kind, watch.owner() + found.seen, watch)
        return None

    def _check(self, training: Training, watch: ScaleWatch) -> Finding | None:
        at_floor = watch.at_floor()
        watch.floor_steps = watch.floor_steps + 1 if at_floor else 0
        if at_floor and watch.skipped_run >= 3:
            return Finding(Failure.SCALE_AT_FLOOR,
                           f"loss scale {watch.scale():g} at its floor {watch.floor:g} and "
                           f"{watch.skipped_run} updates skipped there")
        if at_floor and watch.floor_steps == self.max_skipped \
                and training.batch() is not None and training.collapsed(watch):
            return Finding(Failure.SCALE_COLLAPSED,
                           f"loss scale {watch.scale():g} at its floor for {watch.floor_steps} "
                           "steps, though the batch's gradients fit float16 at "
                           f"{training.fitting_scale(watch):g}")
        if watch.skipped_run >= self.max_skipped:
            return Finding(Failure.SKIPPED_UPDATES,
                           f"{watch.skipped_run} updates skipped in a row")
        return None


class LossSpikes(Detector):
    """A step's loss far above its recent level (``watch.SpikeWatch``)."""

    def __init__(self, sigmas: float) -> None:
        self.sigmas = sigmas
        self._spikes = SpikeWatch(sigmas=sigmas)

    def after_step(self, training: Training, step: StepReading) -> Finding | None:
        if step.loss is not None and self._spikes.is_spike(step.loss):
            return Finding(Failure.LOSS_SPIKE, f"loss {step.loss:.4g} above the recent level's "
                                               f"bar {self._spikes.threshold():.4g}")
        return None

    def after_trip(self, restored: bool) -> None:
        if restored:   # the loss goes back to the snapshot's level: learn it anew
            self._spikes = SpikeWatch(sigmas=self.sigmas)


class OnTheBatch(Detector):
    """A check on the kept batch, after a step when due and at each epoch's end, spaced to take
    at most ``budget`` of the training's time (``watch.Spacing``)."""

    def __init__(self, every: int | None, budget: float) -> None:
        self._spacing = Spacing(every, budget)

    def after_step(self, training: Training, step: StepReading) -> Finding | None:
        return self._when_due(training, at_epoch_end=False)

    def after_epoch(self, training: Training, figures: dict[str, Any]) -> Finding | None:
        return self._when_due(training, at_epoch_end=True)

    def _when_due(self, training: Training, at_epoch_end: bool) -> Finding | None:
        batch = training.batch()
        if batch is None or not training.sixteen_bit:
            return None
        started = time.perf_counter()
        if not self._spacing.due(training.step, at_epoch_end, started):
            return None
        try:
            return self.check(training, batch)
        finally:
            self._spacing.ran(training.step, started, time.perf_counter())

    def check(self, training: Training, batch: Any) -> Finding | None:
        raise NotImplementedError


class SilentLayers(OnTheBatch):
    """Each 16-bit layer's output against its float32 computation (``fidelity``): a layer
    broken on at least half the batch, or beyond any rounding at two checks in a row."""

    def __init__(self, every: int | None, budget: float) -> None:
        super().__init__(every, budget)
        self._suspects: dict[str, int] = {}   # layer -> checks in a row it disagreed

    def check(self, training: Training, batch: Any) -> Finding | None:
        x = keras.utils.unpack_x_y_sample_weight(batch)[0]
        found = [item for item in fidelity.compare_layers(training.model, x)
                 if item.layer not in training.config.float32.layers]
        self._suspects = {item.layer: self._suspects.get(item.layer, 0) + 1 for item in found}
        lasting = [item for item in found
                   if item.broken >= 0.5 or self._suspects[item.layer] >= 2]
        if lasting:
            return Finding(Failure.SILENT_LAYER, "; ".join(item.describe() for item in lasting))
        return None

    def after_trip(self, restored: bool) -> None:
        self._suspects = {}


class PrecisionLoss(OnTheBatch):
    """The kept batch's loss as the model runs against the same weights in float32
    (``precision_loss.LossGapWatch``)."""

    def __init__(self, every: int | None, budget: float) -> None:
        super().__init__(every, budget)
        self._gap = precision_loss.LossGapWatch()

    def check(self, training: Training, batch: Any) -> Finding | None:
        seen = self._gap.check(training.model, batch)
        return Finding(Failure.PRECISION_LOSS, seen) if seen else None


class NonFiniteValidation(Detector):
    """An epoch's validation loss is NaN or inf."""

    def after_epoch(self, training: Training, figures: dict[str, Any]) -> Finding | None:
        val = figures.get("val_loss")
        if val is not None and not math.isfinite(val):
            return Finding(Failure.VAL_NON_FINITE, f"validation loss {val}")
        return None


class Float32Gap(Detector):
    """``float32_check=``'s data evaluated as the model runs and in float32 (the figures the
    callback adds each epoch), judged by ``precision_loss.Float32CheckWatch``."""

    def __init__(self) -> None:
        self._judge = precision_loss.Float32CheckWatch()

    def after_epoch(self, training: Training, figures: dict[str, Any]) -> Finding | None:
        if "check_loss" not in figures:
            return None
        seen = self._judge.judge(figures["check_loss"], figures["check_loss_float32"])
        return Finding(Failure.FLOAT32_GAP, seen) if seen else None
