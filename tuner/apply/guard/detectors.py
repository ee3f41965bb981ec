"""The guard's detectors: each answers one question after a step or after an epoch, "did the
training fail, and what did it show?", with a ``Finding`` (a failure kind and what was seen),
several (one per failing optimizer), or None. The callback asks every detector at every step
and epoch (each keeps its own counts whatever the others found) and hands all the findings of
that step to one trip of the repair ladder (``ladder``); after a trip each hears what it did
(``after_trip``: a ``TripReport``).

A new kind of failure is one ``Detector`` and one rung, passed to the guard
(``PrecisionGuard(detectors=[...], rungs=[...])``): nothing here changes
(tests/apply/guard/test_extending.py adds one).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import keras

from tuner.apply.guard import cause, fidelity, precision_loss, readings, scales
from tuner.apply.guard.failures import Failure, of_precision
from tuner.apply.guard.scales import ScaleWatch
from tuner.apply.guard.training import Training
from tuner.apply.guard.watch import Harm, InARow, Spacing, SpikeWatch


@dataclass(frozen=True)
class Finding:
    """A failure a detector saw: its kind (a ``Failure``, or a string of a detector's own), what
    it saw (one phrase for the event), the optimizer whose loss scale failed, and anything the
    detector hands its rung (``detail``)."""

    kind: str
    seen: str
    watch: ScaleWatch | None = None
    detail: Any = None


@dataclass(frozen=True)
class TripReport:
    """What a trip did, as the detectors hear it: its kind, whether the weights went back
    (``position``: the step the weights hold after it), what it repaired (``repairs``: the
    kinds of repair, empty where none), and the ``Replaced`` state that takes it back."""

    kind: str
    position: int
    restored: bool
    repairs: frozenset[str] = frozenset()
    replaced: Any = None
    signature: tuple = ()
    step: int = 0
    action: str = ""


@dataclass(frozen=True)
class StepReading:
    """What a training step left to read: its loss (None where the model reports none of its
    own, as a GAN's ``train_step``) and Keras's logs."""

    loss: float | None
    logs: dict


class Detector:
    """One check of the training; each method returns a ``Finding``, several, or None."""

    def after_step(self, training: Training, step: StepReading
                   ) -> Finding | Iterable[Finding] | None:
        return None

    def after_epoch(self, training: Training, figures: dict[str, Any]
                    ) -> Finding | Iterable[Finding] | None:
        return None

    def after_trip(self, report: TripReport) -> None:
        """A trip happened: what it did (``report.restored``: the weights went back)."""


def findings(answer: Finding | Iterable[Finding] | None) -> list[Finding]:
    """A detector's answer as a list."""
    if answer is None:
        return []
    return [answer] if isinstance(answer, Finding) else list(answer)


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
    """Each optimizer's loss scale, every one of them at every step (a finding for each that
    fails): at its floor while updates are still skipped there; at its floor for
    ``max_skipped`` steps though the kept batch fits higher (collapsed); ``max_skipped``
    updates skipped in a row; or a fixed scale far too large, found on the first update it
    skips: the kept batch's gradients overflow even at 2^-4 of it (no batch's luck explains
    that: no run of skips to wait for)."""

    def __init__(self, max_skipped: int) -> None:
        self.max_skipped = max_skipped
        self._probed: set[str] = set()   # fixed scales probed in their current run of skips

    def after_step(self, training: Training, step: StepReading) -> list[Finding]:
        found = []
        for watch in training.scales:
            if not watch.scaled:   # no scale: no update skipped, no floor
                continue
            finding = self._check(training, watch)
            if finding is not None:
                found.append(Finding(finding.kind, watch.owner() + finding.seen, watch))
        return found

    def _check(self, training: Training, watch: ScaleWatch) -> Finding | None:
        if watch.skipped_run == 0:
            self._probed.discard(watch.name)
        if watch.at_floor() and watch.skipped_run >= 3:
            return Finding(Failure.SCALE_AT_FLOOR,
                           f"loss scale {watch.scale():g} at its floor {watch.floor:g} and "
                           f"{watch.skipped_run} updates skipped there")
        if watch.at_floor() and watch.floor_steps == self.max_skipped \
                and training.batch() is not None and training.collapsed(watch):
            return Finding(Failure.SCALE_COLLAPSED,
                           f"loss scale {watch.scale():g} at its floor for {watch.floor_steps} "
                           "steps, though the batch's gradients fit float16 at "
                           f"{training.fitting_scale(watch):g}")
        if watch.skipped_run >= self.max_skipped:
            return Finding(Failure.SKIPPED_UPDATES,
                           f"{watch.skipped_run} updates skipped in a row")
        if not watch.dynamic and watch.skipped_run \
                and watch.name not in self._probed and training.batch() is not None:
            self._probed.add(watch.name)
            below = watch.known_scale() / 2.0**cause.FLOOR_HEADROOM
            if scales.overflows(training.model, training.batch(), watch, below):
                return Finding(Failure.SKIPPED_UPDATES,
                               f"{watch.skipped_run} update(s) skipped at the fixed loss scale "
                               f"{watch.scale():g}, and the kept batch's gradients overflow "
                               f"float16 even at {below:g}")
        return None

    def after_trip(self, report: TripReport) -> None:
        self._probed = set()


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

    def after_trip(self, report: TripReport) -> None:
        if report.restored:   # the loss goes back to the snapshot's level: learn it anew
            self._spikes = SpikeWatch(sigmas=self.sigmas)


class OnTheBatch(Detector):
    """A check on the kept batch, after a step when due and at each epoch's end, spaced to take
    at most ``budget`` of the training's time (``watch.Spacing``; ``budget=None``: by steps
    alone). ``clock``: where the time is read (``time.perf_counter``)."""

    def __init__(self, every: int | None, budget: float | None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._spacing = Spacing(every, budget)
        self._clock = clock

    def after_step(self, training: Training, step: StepReading) -> Finding | None:
        return self._when_due(training, at_epoch_end=False)

    def after_epoch(self, training: Training, figures: dict[str, Any]) -> Finding | None:
        return self._when_due(training, at_epoch_end=True)

    def _when_due(self, training: Training, at_epoch_end: bool) -> Finding | None:
        started = self._clock()
        if not self._spacing.due(training.step, at_epoch_end, started) \
                or not training.sixteen_bit:
            return None
        batch = training.batch()
        if batch is None:
            return None
        try:
            return self.check(training, batch)
        finally:
            self._spacing.ran(training.step, started, self._clock())

    def check(self, training: Training, batch: Any) -> Finding | None:
        raise NotImplementedError


class SilentLayers(OnTheBatch):
    """Each 16-bit layer's output against its float32 computation (``fidelity``): a layer
    broken on at least half the batch, or beyond any rounding at two checks in a row."""

    def __init__(self, every: int | None, budget: float | None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(every, budget, clock)
        self._suspects = InARow(2)   # layers disagreeing at checks in a row

    def check(self, training: Training, batch: Any) -> Finding | None:
        x = keras.utils.unpack_x_y_sample_weight(batch)[0]
        found = [item for item in fidelity.compare_layers(training.model, x)
                 if item.layer not in training.config.float32.layers]
        running = set(self._suspects.seen(item.layer for item in found))
        lasting = [item for item in found if item.broken >= 0.5 or item.layer in running]
        if lasting:
            return Finding(Failure.SILENT_LAYER, "; ".join(item.describe() for item in lasting))
        return None

    def after_trip(self, report: TripReport) -> None:
        self._suspects.forget()


class PrecisionLoss(OnTheBatch):
    """The kept batch's loss as the model runs against the same weights in float32
    (``precision_loss.LossGapWatch``)."""

    def __init__(self, every: int | None, budget: float | None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(every, budget, clock)
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


class RepairHarm(Detector):
    """Does no harm: after a trip that repaired something (layers moved, a loss scale changed)
    while the run it replaced could go on, the repaired run's step losses are held against the
    replaced run's (``watch.Harm``); worse is a ``repair_worse`` finding whose ``detail`` is the
    trip to take back (``ladder.TakeBack``)."""

    def __init__(self) -> None:
        self._losses: dict[int, float] = {}    # position -> step loss of the run as it goes
        self._judging: tuple[Harm, TripReport] | None = None

    def after_step(self, training: Training, step: StepReading) -> Finding | None:
        if step.loss is None:
            return None
        self._losses[training.position] = step.loss
        if self._judging is None:
            return None
        harm, report = self._judging
        seen = harm.add(step.loss)
        if harm.done:
            self._judging = None
        if seen is None:
            return None
        return Finding(Failure.REPAIR_WORSE, f"{seen} after the repair at step {report.step}",
                       detail=report)

    def after_trip(self, report: TripReport) -> None:
        replaced, self._judging = self._losses, None
        self._losses = {p: loss for p, loss in replaced.items() if p <= report.position}
        if not report.repairs or report.replaced is None or not report.replaced.going \
                or of_precision(report.kind):
            # A precision failure's replaced run is not a level to hold the repair to: its loss
            # as it runs is what rounding made of it (offset_blocks: 0.43 as it runs, 8.6 in
            # float32; the repaired run starts over at 1.1 and ends at float32's 0.006).
            return
        harm = Harm(replaced, report.position, report.replaced.position)
        if harm.judgeable:
            self._judging = (harm, report)
