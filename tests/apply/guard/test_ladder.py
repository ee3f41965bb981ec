"""The repair ladder on its own (tuner.apply.guard.ladder), with fake loss-scale watches and no
training: what it remembers across trips. A repair taken back is not tried again for the same
failure, a failure with nothing left to try is left as it is (no repair spent), and both are
remembered by the optimizers that failed, each of them, not by the failure's kind: another
optimizer's failure of the same kind is still repaired."""

from __future__ import annotations

import keras

from tuner.apply.config import LossScale, PrecisionConfig
from tuner.apply.guard import Finding
from tuner.apply.guard.detectors import TripReport
from tuner.apply.guard.ladder import Ladder
from tuner.apply.guard.training import Training


class FakeOptimizer:
    initial_scale = 2.0**15


class FakeWatch:
    """What the ladder reads of a loss scale, and the restarts it asks for."""

    scaled = applied = dynamic = True
    floor = 1.0

    def __init__(self, name: str) -> None:
        self.name, self.optimizer, self.restarts = name, FakeOptimizer(), []

    def owner(self) -> str:
        return f"{self.name}: "

    def restart(self, scale: float) -> None:
        self.restarts.append(scale)


class PutBack:
    def __init__(self) -> None:
        self.times = 0

    def put_back(self, training) -> None:
        self.times += 1


def _ladder(*watches: FakeWatch) -> Ladder:
    config = PrecisionConfig(policy="mixed_float16", loss_scale=LossScale("dynamic"))
    training = Training(config)
    training.model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    training.scales = list(watches)
    return Ladder(training, max_repairs=5)


def _at_floor(*watches: FakeWatch) -> list[Finding]:
    return [Finding("scale_at_floor", f"{watch.name} at its floor", watch) for watch in watches]


def test_a_taken_back_repair_leaves_each_optimizer_alone_and_not_the_kind():
    """Mutations caught: the trip's signature always its kind (tuner/apply/guard/trip.py), and
    ``LeaveAsIs`` no longer tolerating each optimizer (tuner/apply/guard/rungs.py)."""
    first, second, third = FakeWatch("d_optimizer"), FakeWatch("g_optimizer"), \
        FakeWatch("e_optimizer")
    ladder = _ladder(first, second, third)

    repaired = ladder.climb(_at_floor(first, second))   # both in one trip, both restarted
    assert first.restarts == second.restarts == [2.0**15] and ladder.repairs == 1
    assert repaired.signature == ("d_optimizer", "g_optimizer")

    replaced = PutBack()
    report = TripReport("scale_at_floor", 10, False, frozenset(repaired.repairs), replaced,
                        repaired.signature, 10, repaired.action)
    taken = ladder.climb([Finding("repair_worse", "worse", None, report)])
    assert replaced.times == 1 and taken.action.startswith("took back the repair of step 10")
    assert ladder.repairs == 1   # a take-back spends no repair

    left = ladder.climb(_at_floor(first, second))   # the same failure: nothing left to try
    assert "left as it is" in left.action and first.restarts == [2.0**15]
    assert ladder.repairs == 1   # nor does leaving it as it is
    for watch in (first, second):   # each optimizer of it is no longer repaired
        assert not ladder.answers(_at_floor(watch)[0])

    other = ladder.climb(_at_floor(third))   # the same kind, another optimizer: repaired
    assert ladder.answers(_at_floor(third)[0])
    assert third.restarts == [2.0**15] and "e_optimizer: loss scale reset" in other.action
    assert ladder.repairs == 2
