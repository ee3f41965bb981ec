"""Keras's own ``UnitNormalization`` zeroed by float16 (tests/fixtures/tasks/unit_norm.py: raw
readings around 400 into a stem, the norms' sum of squares past 65504, Keras's automatic layer
names): the same kind as the hand-written RMS norm of test_repairs.py, another layer and model.
Unguarded it trains to over 1.5x float32's validation loss with nothing ever non-finite; guarded,
the three norms are moved in one event early in training (before their blocks add anything, so the
model's output does not show them yet) and it ends within 1.5x, still under mixed_float16.
"""

from __future__ import annotations

import math

import pytest

from tests.apply.guard.test_repairs import ROOT, _fit, _float16, _task
from tuner import PrecisionConfig

pytestmark = pytest.mark.slow
NORMS = {"unit_normalization", "unit_normalization_1", "unit_normalization_2"}


def test_keras_unit_normalization_zeroed_by_float16_is_moved_and_the_policy_kept():
    task = _task(ROOT / "tests" / "fixtures" / "tasks" / "unit_norm.py")
    float32 = _fit(task, PrecisionConfig(), epochs=30, guard=False)[1][-1]
    _, unguarded, _ = _fit(task, _float16(1e-6), epochs=30, guard=False)
    _, guarded, watcher = _fit(task, _float16(1e-6), epochs=30, guard=True)
    assert all(math.isfinite(value) for value in unguarded)
    assert unguarded[-1] > 1.5 * float32
    assert guarded[-1] <= 1.5 * float32, (guarded[-1], float32)
    assert [event.kind for event in watcher.events] == ["silent_layer"]
    assert set(watcher.events[0].layers) == NORMS
    assert watcher.config.policy == "mixed_float16"
    assert set(watcher.config.float32.layers) == NORMS
