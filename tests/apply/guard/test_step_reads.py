"""How often the guard reads the steps' ledger (tuner.apply.guard.step_reads.LedgerReads): the
fewest steps whose training time the read takes at most 0.5% of, measured as the training runs;
never past a snapshot that is due, nor past the batches the keeper may hold; every row at an
epoch's end. A fake ledger and clock: the rule, not the machine.
"""

from __future__ import annotations

import math

import pytest

from tuner.apply.guard.ledger import LedgerRow
from tuner.apply.guard.step_reads import READ_BUDGET, LedgerReads


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeLedger:
    """Rows of a loss of 1.0 a step; a read takes ``read_seconds`` on the clock."""

    def __init__(self, clock: Clock, read_seconds: float) -> None:
        self.clock, self.read_seconds = clock, read_seconds
        self.written = self.seen = self.reads = 0
        self.tracker = None   # no loss tracker to put the kept steps back into

    def step(self) -> None:
        self.written += 1

    def read(self) -> list[LedgerRow]:
        self.reads += 1
        self.clock.now += self.read_seconds
        rows = [LedgerRow(float(step + 1), float(step + 1), None, {}, (), ())
                for step in range(self.seen, self.written)]
        self.seen = self.written
        return rows

    def skip(self) -> None:
        self.seen = self.written


def _train(reads: LedgerReads, ledger: FakeLedger, clock: Clock, steps: int,
           step_seconds: float) -> list[int]:
    """Run ``steps`` steps; the steps at which a read happened."""
    read_at = []
    for step in range(1, steps + 1):
        clock.now += step_seconds
        ledger.step()
        rows = reads.after_call({}, 1)
        if rows:
            assert [row.loss for row in rows] == [1.0] * len(rows)   # each step's own loss
            read_at.append(step)
            reads.spent(0.0)
    return read_at


def _reads(read_seconds=1e-3, max_window=50, until_snapshot=lambda: 50,
           held=lambda: None):
    clock = Clock()
    ledger = FakeLedger(clock, read_seconds)
    return LedgerReads(ledger, max_window, until_snapshot, held, clock=clock), ledger, clock


def test_the_window_is_the_fewest_steps_whose_time_the_read_takes_its_budget_of():
    reads, ledger, clock = _reads(read_seconds=1e-3)
    read_at = _train(reads, ledger, clock, 200, step_seconds=10e-3)
    wanted = math.ceil(1e-3 / (READ_BUDGET * 10e-3))   # 20 steps of 10 ms for a 1 ms read
    assert reads.window == wanted
    gaps = [b - a for a, b in zip(read_at, read_at[1:])]
    assert gaps[-3:] == [wanted] * 3
    assert ledger.reads == len(read_at) < 200 / wanted + 4


def test_a_slow_step_is_read_after_each_and_a_window_never_passes_its_bounds():
    reads, ledger, clock = _reads(read_seconds=1e-4)
    _train(reads, ledger, clock, 20, step_seconds=1.0)   # a read is nothing beside the step
    assert reads.window == 1
    reads, ledger, clock = _reads(read_seconds=1.0, max_window=30)
    _train(reads, ledger, clock, 100, step_seconds=1e-3)
    assert reads.window == 30   # the snapshot interval


@pytest.mark.parametrize("bound", ["snapshot", "batches"])
def test_a_read_comes_where_a_snapshot_is_due_or_the_kept_batches_are_full(bound):
    reads, ledger, clock = _reads(read_seconds=1.0, max_window=50,
                                  until_snapshot=(lambda: 7) if bound == "snapshot" else
                                  (lambda: 50), held=(lambda: 3) if bound == "batches" else
                                  (lambda: None))
    read_at = _train(reads, ledger, clock, 40, step_seconds=1e-3)
    gap = 7 if bound == "snapshot" else 3
    assert [b - a for a, b in zip(read_at, read_at[1:])][-3:] == [gap] * 3


def test_every_step_is_read_at_an_epochs_end_and_a_trip_forgets_its_probes_rows():
    reads, ledger, clock = _reads(read_seconds=1e-3)
    _train(reads, ledger, clock, 60, step_seconds=10e-3)
    reads.drain()
    for _ in range(3):   # three steps into the next window
        ledger.step()
        assert reads.after_call({}, 1) == []
    assert len(reads.drain()) == 3 and reads.drain() == []
    ledger.step()
    ledger.step()   # a repair's probe ran the step: its row is not the training's
    reads.tripped()
    assert reads.drain() == []
