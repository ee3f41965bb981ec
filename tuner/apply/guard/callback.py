"""``PrecisionGuard``: a Keras callback that watches a training under a ``PrecisionConfig`` and
repairs what fails on the failing batch, then lets the training go on.

Checks (each failure a kind of ``failures.Failure``), of every step (read from what the
compiled step wrote of itself, a window of steps at a time: ``ledger``, ``step_reads``; the
train function's wrapper tells the guard of each call, so Keras calls no hook of it after a
step): a non-finite loss; a
run of skipped updates (the optimizer's iterations not advancing under a loss scale); a dynamic
loss scale at its floor; a loss far above its recent level (``watch.SpikeWatch``). Every
``check_every`` steps and at each epoch's end, spaced to take at most ``CHECK_BUDGET`` of the
training's time together: each 16-bit layer's output against the same layer in float32 on the
kept batch (``fidelity``: a finite, wrong output that no NaN ever shows); a layer broken on half
the batch, or beyond any rounding at two checks in a row, is a failure; then the kept batch's
loss as the model runs against the same weights in float32 (``precision_loss``: rounding that
costs the model what it learns, with every layer's own output within 1%). After every epoch: a
non-finite validation loss, and (``float32_check=``, off by default: it costs two evaluations)
the same judgement on the check's data.

Each check is a detector (``detectors``); every one is asked at every step and epoch, and all
the failures of a step (every failing optimizer's) are one trip of the repair ladder
(``ladder``), sized by what the failing batch shows: restore the last snapshot where the
weights changed since it (a skipped update changes none), move every layer the batch
shows at fault (non-finite, disagreeing with float32, or overflowing backward even at the loss
scale's floor), and for a precision failure those do not bring back the smallest set of
layers whose float32 does (``float32_set``); lower each failing optimizer's floor or fixed
scale, or reset a collapsed one. A precision failure in the training's first ``EARLY`` share
restarts it from its start. After a repair the repaired run is held against the run it
replaced (``checks.RepairHarm``): one that does worse is taken back, and that failure gets
what was not tried, or is left as it is. The last resort (mixed policies: every layer in float32)
ends the watch; under pure 16-bit policies, where layers cannot move mid-training (the guard records
them in ``guard.config`` for next time), running out of repairs raises ``GuardError``. A config
whose dtype reaches (almost) no layer is an event at the start; a model whose optimizer is not
compiled as the config was tuned (Keras's own loss scale over a config tuned without one, no loss
scale where one was tuned: tuner.apply.compiling) is refused before its first step.

A healthy training is untouched: the guard reads variables (its step's row only reads what
the step wrote), runs inference-mode passes on a batch it keeps by reference, and calls Keras's
own compiled step (XLA included), so the loss history is the same bit for bit
(tests/apply/guard/test_guard.py).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence

import keras

from tuner.apply.compiling import untuned
from tuner.apply.config_data import ConfigData
from tuner.apply.guard import detectors as checks
from tuner.apply.guard import ledger, mlflow_record, readings, scales, step_reads
from tuner.apply.guard.detectors import Detector, Finding, StepReading, findings
from tuner.apply.guard.events import GuardEvent
from tuner.apply.guard.failures import Failure, Notice
from tuner.apply.guard.ladder import End, Ladder, Rung
from tuner.apply.guard.training import Training
from tuner.apply.reach import unreached_model
from tuner.errors import ConfigError, GuardError

__all__ = ["GuardError", "PrecisionGuard"]


# The share of training time the checks on the kept batch (the per-layer float32 comparison,
# the loss against float32's) may take together: each is spaced out to keep within its half.
CHECK_BUDGET = 0.02
# A precision failure found within this share of the training restarts it from its start: the
# weights learned so far learned to live with the rounding (and the start is kept till then).
EARLY = 0.25


class PrecisionGuard(keras.callbacks.Callback):
    """Watch and repair a training under ``config``; add it to ``model.fit(callbacks=[...])``.

    ``snapshot_every``: steps between host-memory snapshots (weights and optimizer state;
    None: 50, or further apart where one would take more than 0.5% of the training's time);
    ``max_repairs``: repairs before the last resort, then ``GuardError``; ``max_skipped``:
    consecutive skipped updates that count as a failure (of each optimizer the model holds: a
    GAN's two are watched and repaired each); ``spike_sigmas``: how many robust
    standard deviations of the recent log loss make a spike; ``check_every``: steps between
    per-layer float32 comparisons on the kept batch (also at each epoch's end; None: never);
    ``float32_check``: data (``(x, y)`` or a dataset) to evaluate on as-is and in float32
    each epoch; ``data``: a batch to diagnose on before the training's own is kept (or as well
    as it: it is used where no batch was kept); ``check_budget``: the share of the training's
    time the checks on the kept batch may take (``None``: spaced by ``check_every`` steps
    alone, whatever the machine's load); ``verbose``: 0 silences the one line per event;
    ``detectors``, ``rungs``: a failure kind of your own (a ``detectors.Detector`` and a rung,
    ``ladder.Rung``), asked after the guard's own detectors and run before its diagnosis.
    """

    def __init__(self, config: ConfigData, *, snapshot_every: int | None = None,
                 max_repairs: int = 5, max_skipped: int = 25, spike_sigmas: float = 12.0,
                 check_every: int | None = 200, float32_check: Any = None, data: Any = None,
                 check_budget: float | None = CHECK_BUDGET, verbose: int = 1,
                 detectors: Sequence[Detector] = (), rungs: Sequence[Rung] = ()) -> None:
        super().__init__()
        self.snapshot_every = None if snapshot_every is None else \
            readings.positive_int("snapshot_every", snapshot_every)
        self.max_repairs = readings.positive_int("max_repairs", max_repairs)
        self.max_skipped = readings.positive_int("max_skipped", max_skipped)
        self.check_every = None if check_every is None else \
            readings.positive_int("check_every", check_every)
        self.spike_sigmas = float(spike_sigmas)
        self.float32_check = float32_check
        self.verbose = verbose
        self.events: list[GuardEvent] = []
        self.history: list[dict[str, Any]] = []   # per-epoch figures
        self._training = Training(config, data, self.snapshot_every)
        self._ladder = Ladder(self._training, self.max_repairs, rungs)
        # Every check, asked at every step and epoch; a trip's kind is the first one's finding.
        self._detectors: tuple[Detector, ...] = (
            checks.RepairHarm(), checks.NonFiniteLoss(),
            checks.LossScales(self.max_skipped), checks.LossSpikes(self.spike_sigmas),
            checks.NonFiniteValidation(), checks.Float32Gap(),
            checks.SilentLayers(self.check_every, _half(check_budget)),
            checks.PrecisionLoss(self.check_every, _half(check_budget)), *detectors)
        self._reads: step_reads.HostReads | step_reads.LedgerReads = step_reads.HostReads(None)

    # -- what the guard reports --------------------------------------------------------------
    @property
    def config(self) -> ConfigData:
        """The config as applied, with every repair so far (what to train with next time)."""
        return self._training.config

    @property
    def data(self) -> Any:
        return self._training.data

    @property
    def repairs(self) -> int:
        return self._ladder.repairs

    @property
    def snapshot_bytes(self) -> int:
        return self._training.snapshot_bytes

    def keep(self, batch: Any) -> None:
        """Keep ``batch`` as the one a failure is diagnosed on: for a loop that is not ``fit``
        (tuner.apply.guard.loop), which hands each batch over before its step."""
        self._training.keeper.keep(self.model, batch)

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None) -> None:
        self._begin(under_fit=True)

    def begin_loop(self) -> None:
        """Begin the watch of a loop that is not ``fit`` (tuner.apply.guard.loop): it calls
        ``after_step`` after each step."""
        self._begin(under_fit=False)

    def _begin(self, under_fit: bool) -> None:
        model = self.model
        untuned_because = untuned(self.config, model)
        if untuned_because:  # a training the config was never tuned for: refused, one line
            raise ConfigError(f"the guard refuses to watch this training: {untuned_because}")
        training = self._training
        training.begin(model)
        self._reads = step_reads.begin(training, readings.loss_tracker(model),
                                       self._after_call if under_fit else None)
        unreached = unreached_model(model, self.config.policy)
        if unreached:  # nothing to guard: say why, as the tuner's trial does
            self._record(Notice.PRECISION_UNREACHED, unreached, (), "nothing to repair",
                         "no 16-bit layer")

    def on_train_end(self, logs=None) -> None:
        self._close()

    def on_epoch_begin(self, epoch, logs=None) -> None:
        training = self._training
        training.epoch = epoch
        for watch in training.scales:
            watch.epoch_began()
        self._reads.epoch_began((self.params or {}).get("steps"))

    def after_step(self, logs: dict) -> None:
        """One step ran (a loop's: tuner.apply.guard.loop), its ``logs`` as numbers."""
        self._after_call(logs, 1)

    def _after_call(self, logs: Any, steps: int) -> None:
        """``steps`` steps ran (one call of the train function): read their rows where due."""
        rows = self._reads.after_call(logs or {}, steps)
        if rows:
            self._take(rows)

    def _take(self, rows: list[ledger.StepRow]) -> None:
        """The rows of the steps run since the last read, each judged as its step: every
        detector asked, a failure repaired, and a snapshot where one is due after a window found
        healthy. The steps after a trip that restored or repaired ran on the state it replaced:
        they are not judged (their findings would be the same failure's, found again)."""
        started = time.perf_counter()
        training = self._training
        batches = training.keeper.take_window(len(rows))
        for index, row in enumerate(rows):
            if training.settled:
                break
            training.keeper.point_at(batches[index])
            training.stepped(row)
            step = StepReading(row.loss, row.logged)
            found = self._answered([finding for detector in self._detectors
                                    for finding in findings(detector.after_step(training, step))])
            if found and self._repair(found, later=len(rows) - index - 1):
                training.keeper.point_at(batches[-1])
                break
            if not found:
                self._reads.kept(row)
            if training.start is not None and not self._early():
                training.start = None
        else:
            if training.snapshot_due():
                training.take_snapshot()
        self._reads.spent(time.perf_counter() - started)

    def on_epoch_end(self, epoch, logs=None) -> None:
        logs = logs or {}
        rows = self._reads.drain()
        if rows:
            self._take(rows)
        training = self._training
        figures = {"epoch": epoch, "loss": readings.scalar(logs.get("loss")),
                   "val_loss": readings.scalar(logs.get("val_loss")),
                   **scales.epoch_figures(self._training.scales)}
        if self.float32_check is not None:
            figures.update(readings.evaluate_as_is_and_in_float32(self.model,
                                                                  self.float32_check))
        self.history.append(figures)
        if training.settled:
            return
        found = self._answered([finding for detector in self._detectors
                                for finding in findings(detector.after_epoch(training, figures))])
        if found:
            self._repair(found)

    def _early(self) -> bool:
        """Within the first ``EARLY`` of the training's steps (the first epoch where fit does
        not know how many steps an epoch has)."""
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        if not epochs or not steps:
            return self._training.epoch == 0
        return self._training.step <= EARLY * epochs * steps

    # -- repairing ---------------------------------------------------------------------------
    def _answered(self, found: list[Finding]) -> list[Finding]:
        """The findings the ladder still repairs (not those of a failure left as it is)."""
        return [finding for finding in found if self._ladder.answers(finding)]

    def _repair(self, found: list[Finding], later: int = 0) -> bool:
        """One trip for ``found``; ``later``: steps already run after the failing one (read in
        the same window). True where the trip restored, repaired or took a repair back: those
        steps ran on the state it replaced, and count only as steps the training ran."""
        trip = self._ladder.climb(found)
        if trip.end is End.STOP:
            self._stop(trip.seen)
        training = self._training
        replaced = trip.restored is not None or bool(trip.repairs) \
            or trip.kind == Failure.REPAIR_WORSE or training.settled
        if replaced and trip.restored is None:
            training.position += later
        self.model.reset_metrics()
        for watch in training.scales:   # count from the state the trip left
            watch.resync()
        self._reads.tripped()
        report = trip.report(training)
        for detector in self._detectors:
            detector.after_trip(report)
        self._record(trip.kind, trip.seen, trip.moved, trip.action, trip.why)
        if replaced:
            training.step += later
        return replaced

    def _stop(self, seen: str) -> None:
        """Out of repairs with no last resort: stop the training, cleanly (Keras does not call
        ``on_train_end`` when a callback raises)."""
        training = self._training
        self.model.stop_training = True
        message = (f"precision guard: {seen} at epoch {training.epoch + 1} step {training.step} "
                   f"after {self.repairs} repairs (tried: "
                   f"{'; '.join(self._ladder.tried) or 'nothing'}); "
                   "stopping. Train with guard.config, or in float32.")
        self._record(Notice.GAVE_UP, seen, (), "stopped the training", message)
        self._close()
        raise GuardError(message)

    def _record(self, kind: str, seen: str, layers, action: str, why: str) -> None:
        training = self._training
        event = GuardEvent(training.epoch + 1, training.step, kind, seen, tuple(layers), why,
                           action)
        self.events.append(event)
        if self.verbose:
            print(f"\n{event.line()}", file=sys.stderr, flush=True)

    def _close(self) -> None:
        self._training.keeper.unwrap()
        self._reads.close()
        mlflow_record.log_to_mlflow(self.history,
                                    [event.to_dict() for event in self.events], self.config)


def _half(budget: float | None) -> float | None:
    return None if budget is None else budget / 2
