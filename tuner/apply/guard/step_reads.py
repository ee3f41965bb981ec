"""How the guard hears of the steps a training ran, as a ``StepRow`` a step, in order: read
from the step's own ledger (tuner.apply.guard.ledger) once every few steps where the step can
write one (``LedgerReads``), or from the host after every step (``HostReads``: a loop that is
not ``fit``, a training under ``tf.distribute``, one run eagerly).

``LedgerReads`` spaces its reads by their cost: the window (steps between two reads) is the
fewest steps whose training time the read takes at most ``READ_BUDGET`` of, measured as the
training runs, and at most the snapshot interval: a window ends where a snapshot is due, so a
failure is found before the snapshot it restores from is replaced; and at most as many steps as
the keeper may hold the batches of (``state.WINDOW_BYTES``). At an epoch's end every row is
read.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import keras

from tuner.apply.guard import readings
from tuner.apply.guard.ledger import CAPACITY, LedgerRow, StepLedger, StepRow, usable
from tuner.apply.guard.state import StateReader
from tuner.apply.guard.training import Training
from tuner.apply.guard.watch import LossSeries

# The share of the training's time the reads of the ledger may take.
READ_BUDGET = 0.005


def begin(training: Training, tracker: Any,
          after: Callable[[Any, int], None] | None) -> HostReads | LedgerReads:
    """How the guard will hear of the training's steps. ``after``: under ``fit``, what the train
    function's wrapper calls after each call (fit made its train function before the guard is
    called: it is wrapped, and where the step can write its own row, made again with the row
    written in it); None for a loop that calls the guard itself."""
    model = training.model
    assert model is not None   # begun
    if after is None or not training.keeper.wrap(model, after=after) or not usable(model):
        return HostReads(tracker)
    training.reader = StateReader()   # one device: the state read in one call
    ledger = StepLedger(model, training.scales, tracker)
    ledger.install()
    training.retrace()
    return LedgerReads(ledger, training.snapshot_every, training.steps_to_snapshot,
                       training.keeper.window_steps)


class KeptLoss:
    """The epoch's loss over the steps the guard kept (judged, not undone by a trip): what the
    loss tracker holds again after a trip resets it. Reset, it would hold nothing where the trip
    came at the epoch's last step (a window read at the epoch's end), and Keras would report the
    epoch's loss as 0, its mean of no steps."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.total = self.count = 0.0

    def add(self, row: StepRow) -> None:
        if self.tracker is not None and row.weight and row.loss is not None \
                and math.isfinite(row.loss):
            self.total += row.loss * row.weight
            self.count += row.weight

    def reset(self) -> None:
        self.total = self.count = 0.0

    def put_back(self) -> tuple[float, float]:
        """Into the tracker (just reset); what it holds now."""
        if self.tracker is None or not self.count:
            return 0.0, 0.0
        self.tracker.total.assign(self.total)
        self.tracker.count.assign(self.count)
        return self.total, self.count


class HostReads:
    """A row after every step, read from the host: the loss from Keras's running-mean tracker
    (two reads) or the logs, and nothing of the optimizers (each ``ScaleWatch`` reads its own)."""

    def __init__(self, tracker: Any) -> None:
        self._tracker = tracker
        self._losses = LossSeries()
        self._kept = KeptLoss(tracker)

    def after_call(self, logs: dict, steps: int) -> list[StepRow]:
        total = count = None
        if self._tracker is not None:
            total = float(keras.ops.convert_to_numpy(self._tracker.total))
            count = float(keras.ops.convert_to_numpy(self._tracker.count))
        logged = readings.scalar(logs.get("loss"))
        loss = self._losses.step_loss(total, count, logged)
        own = {} if loss is not None else {
            name: value for name, value in ((name, readings.scalar(value)) for name, value in
                                            logs.items() if str(name).endswith("loss"))
            if value is not None}
        return [StepRow(loss, own, steps=steps, weight=self._losses.weight)]

    def drain(self) -> list[StepRow]:
        return []

    def kept(self, row: StepRow) -> None:
        """``row`` was judged and stays part of the training."""
        self._kept.add(row)

    def epoch_began(self, steps: int | None = None) -> None:
        self._losses.reset()   # Keras resets the tracker
        self._kept.reset()

    def tripped(self) -> None:
        self._losses.reset(*self._kept.put_back())   # the guard reset the tracker

    def spent(self, seconds: float) -> None:
        """Nothing to space: a host read after every step."""

    def close(self) -> None:
        """Nothing to take off the model."""


class LedgerReads:
    """Rows from the step's own ledger, read once a window of steps."""

    def __init__(self, ledger: StepLedger, max_window: int,
                 until_snapshot: Callable[[], int],
                 batches_held: Callable[[], int | None] = lambda: None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.ledger, self.max_window = ledger, max(1, min(max_window, CAPACITY))
        self.window = min(4, self.max_window)
        self._until_snapshot, self._clock = until_snapshot, clock
        self._batches_held = batches_held   # the most batches a window may keep (their bytes)
        self._pending = 0                 # steps run since the last read
        self._read_at = 1                 # pending steps at which the next read is due
        self._since = clock()             # when the last read ended
        self._spent = 0.0                 # the guard's own time since then (not training)
        self._losses = LossSeries()
        self._kept = KeptLoss(ledger.tracker)
        self._epoch_steps = 0                         # steps run in this epoch,
        self._epoch_length: int | None = None         # of how many (None: not known)

    def after_call(self, logs: dict, steps: int) -> list[StepRow]:
        """The rows of the steps run, once a window of them ran or a snapshot is due (windows
        end where snapshots are taken: every ``snapshot_every`` steps, as without a ledger)."""
        self._pending += steps
        self._epoch_steps += steps
        if self._pending < self._read_at and not (
                self._epoch_length and self._epoch_steps >= self._epoch_length):
            return []
        return self._read(adapt=True)

    def drain(self) -> list[StepRow]:
        return self._read(adapt=False) if self._pending else []

    def kept(self, row: StepRow) -> None:
        """``row`` was judged and stays part of the training."""
        self._kept.add(row)

    def epoch_began(self, steps: int | None = None) -> None:
        """An epoch of ``steps`` steps (None: not known) begins: its last call is read as it
        ends, before Keras takes the epoch's loss from the tracker (a failure found after that
        would leave the failing step in it)."""
        self._losses.reset()   # Keras resets the tracker
        self._kept.reset()
        self._epoch_steps, self._epoch_length = 0, steps

    def tripped(self) -> None:
        """After a repair: the rows its probes of the step wrote are not the training's, and
        the guard reset the tracker (it holds the kept steps' loss again)."""
        self.ledger.skip()
        self._pending = 0
        self._losses.reset(*self._kept.put_back())

    def spent(self, seconds: float) -> None:
        """Time the guard took outside the reads (checks, snapshots, repairs): not the
        training's, so not counted as its steps'. Called after the rows read were judged: the
        next read is due a window on, or where a snapshot is."""
        self._spent += seconds
        self._read_at = max(1, min(self.window, self._until_snapshot() or 1,
                                   self._batches_held() or CAPACITY))

    def close(self) -> None:
        """The model's own step back."""
        self.ledger.uninstall()

    def _read(self, adapt: bool) -> list[StepRow]:
        started = self._clock()
        rows = self.ledger.read()
        ended = self._clock()
        if adapt and self._pending:
            step_seconds = max(started - self._since - self._spent, 1e-6) / self._pending
            wanted = math.ceil((ended - started) / (READ_BUDGET * step_seconds))
            self.window = max(1, min(self.max_window, wanted))
        self._pending, self._since, self._spent = 0, ended, 0.0
        return [self._judged(row) for row in rows]

    def _judged(self, row: LedgerRow) -> StepRow:
        loss = self._losses.step_loss(row.total, row.count, row.logged)
        return StepRow(loss, row.own if loss is None else {}, row.iterations, row.scales,
                       weight=self._losses.weight)
