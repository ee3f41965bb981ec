"""The guard's check rules driven by steps, without a training (fast): each test names the
mutation of the guard it catches (applied to a copy of the module: the test fails).

- "two checks in a row" for the kept batch's loss against float32's (``LossGapWatch``) and
  for a layer's output against float32's (``SilentLayers``);
- a layer broken on half the batch counts at once;
- checks spaced by steps alone where ``check_budget=None`` (deterministic whatever the load).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tuner.apply.guard import detectors, fidelity
from tuner.apply.guard.fidelity import Disagreement
from tuner.apply.guard.precision_loss import BatchLoss, LossGapWatch
from tuner.apply.guard.watch import InARow, Spacing

APART, CLOSE = BatchLoss(4.0, 1.0), BatchLoss(1.0, 1.0)


def test_the_loss_gap_counts_at_the_second_check_running():
    """Mutation caught: ``LossGapWatch``'s ``InARow(2)`` made ``InARow(1)`` (one check
    trips), or the gap's ``>`` made ``<``."""
    watch = LossGapWatch()
    assert watch.judge(APART) is None                 # one check: a batch's luck
    assert "two checks running" in watch.judge(APART)
    assert watch.judge(APART) is None                 # counted from zero after a finding
    assert watch.judge(CLOSE) is None and watch.judge(APART) is None   # broken run
    assert watch.judge(None) is None and watch.judge(APART) is None    # nothing to compare
    assert watch.judge(CLOSE) is None and watch.judge(CLOSE) is None


def _training():
    batch = (np.zeros((4, 2), "float32"), np.zeros(4, "float32"))
    return SimpleNamespace(model=None, config=SimpleNamespace(
        float32=SimpleNamespace(layers=())), batch=lambda: batch, sixteen_bit=True, step=0)


def _silent(monkeypatch, *answers):
    answers = list(answers)
    monkeypatch.setattr(fidelity, "compare_layers", lambda model, x: answers.pop(0))
    check = detectors.SilentLayers(every=1, budget=None)
    training = _training()
    return [check.check(training, training.batch()) for _ in range(len(answers))]


def test_a_layer_disagreeing_counts_at_the_second_check_in_a_row(monkeypatch):
    """Mutation caught: ``SilentLayers``'s ``InARow(2)`` made ``InARow(1)``, or the
    ``item.layer in running`` condition removed (a layer off at two checks never counts)."""
    off = [Disagreement("norm", "float16", worst=0.7, broken=0.2)]
    first, second = _silent(monkeypatch, off, off)
    assert first is None
    assert second is not None and second.kind == "silent_layer" and "norm" in second.seen
    assert _silent(monkeypatch, off, [], off) == [None, None, None]   # not in a row


def test_a_layer_broken_on_half_the_batch_counts_at_once(monkeypatch):
    """Mutation caught: ``item.broken >= 0.5 or`` removed from ``SilentLayers.check``."""
    broken = [Disagreement("norm", "float16", worst=1.0, broken=0.5)]
    assert _silent(monkeypatch, broken)[0] is not None


def test_in_a_row_counts_each_key_on_its_own():
    rule = InARow(2)
    assert rule.seen(["a", "b"]) == [] and rule.seen(["a"]) == ["a"]
    assert rule.seen(["b"]) == [] and rule.seen(["b"]) == ["b"]


def test_without_a_time_budget_checks_are_spaced_by_steps_alone():
    """What the guard tests pass (``check_budget=None``): a check's cost never delays the
    next, so exact-event assertions do not depend on the machine's load."""
    spacing = Spacing(every=10, budget=None)
    assert spacing.due(step=3, at_epoch_end=True, now=0.0)
    spacing.ran(3, started=0.0, ended=0.0)
    spacing.ran(3, started=0.0, ended=500.0)     # a check that took 500 s
    assert spacing.due(step=13, at_epoch_end=False, now=500.0)
    assert not spacing.due(step=12, at_epoch_end=False, now=10_000.0)
