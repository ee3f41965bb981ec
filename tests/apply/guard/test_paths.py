"""One test per check and repair path the other guard tests do not take, each beside the same
training without the guard (the failure shows there), each asserting the outcome:

- a loss spike (one step's loss a million times its level, finite) is undone by a restore;
- a non-finite validation loss (an inference-only statistic gone inf) is undone, and the
  snapshot that held the inf was never kept;
- a fixed loss scale every gradient overflows at: its updates skipped, the scale lowered;
- NaN in the targets is the data's fault: skipped, no repair counted, no layer moved;
- pure float16 (16-bit weights): a layer cannot move mid-training; the guard records it for the
  next training, and with no last resort under a pure policy it stops with ``GuardError``.
"""

from __future__ import annotations

import math
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.apply.guard.test_guard import _train, around
from tests.apply.guard.test_repairs import _fit as _fit_task
from tests.apply.guard.test_repairs import _task
from tuner import PrecisionConfig
from tuner.apply.config import LossScale
from tuner.errors import GuardError

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
BFLOAT16 = PrecisionConfig(policy="mixed_bfloat16")


def _regression(rows=1024, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 16)).astype("float32")
    return x, (x @ rng.normal(size=16) + 0.1 * rng.normal(size=rows)).astype("float32")


def _fit(config, layer, data, *, guard, optimizer, epochs=3, validation=None, **options):
    return _train(config, lambda: around(layer), data, epochs=epochs, guard=guard,
                  optimizer=optimizer, batch_size=32, validation=validation, verbose=0,
                  **options)


_SPIKE_CALLS = tf.Variable(0, trainable=False)  # outside the model: a restore does not replay it


class Spiky(keras.layers.Layer):
    """Identity, except that its 40th training call scales its output by 1000."""

    def call(self, inputs, training=None):
        if not training:
            return inputs
        _SPIKE_CALLS.assign_add(1)
        return inputs * tf.where(tf.equal(_SPIKE_CALLS, 40), tf.constant(1e3, inputs.dtype),
                                 tf.constant(1, inputs.dtype))


@pytest.mark.parametrize("guard", [False, True])
def test_a_loss_spike_is_undone_by_a_restore(guard):
    _SPIKE_CALLS.assign(0)
    model, history, watcher = _fit(BFLOAT16, Spiky(), _regression(), guard=guard,
                                   optimizer=keras.optimizers.SGD(1e-2), snapshot_every=10)
    last = history["loss"][-1]
    if not guard:  # the spike's update wrecks the weights: the loss never comes back
        assert not last < history["loss"][0]
        return
    assert last < 0.5 * history["loss"][0]
    assert [event.kind for event in watcher.events] == ["loss_spike"]
    assert watcher.events[0].step == 40 and "restored step 30" in watcher.events[0].action
    assert watcher.config == BFLOAT16


_STAT_CALLS = tf.Variable(0, trainable=False)


class DriftingStatistic(keras.layers.Layer):
    """Adds a non-trainable statistic at inference; its 100th training call sets it to inf
    (a running statistic that overflowed)."""

    def build(self, shape):
        self.shift = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                     name="shift")

    def call(self, inputs, training=None):
        if training:
            _STAT_CALLS.assign_add(1)
            self.shift.assign(tf.where(tf.equal(_STAT_CALLS, 100), np.inf, self.shift))
            return inputs
        return inputs + tf.cast(self.shift, inputs.dtype)


@pytest.mark.parametrize("guard", [False, True])
def test_a_non_finite_validation_loss_is_undone(guard):
    _STAT_CALLS.assign(0)
    _, history, watcher = _fit(BFLOAT16, DriftingStatistic(), _regression(), guard=guard,
                               optimizer=keras.optimizers.Adam(1e-2), epochs=5,
                               validation=_regression(256, seed=1))
    if not guard:
        assert not math.isfinite(history["val_loss"][-1])
        return
    assert math.isfinite(history["val_loss"][-1])
    event = watcher.events[0]
    assert [e.kind for e in watcher.events] == ["val_non_finite"] and event.epoch == 4
    assert "restored step 50" in event.action  # the step-100 snapshot held the inf


def test_a_fixed_scale_every_gradient_overflows_at_is_lowered():
    task = _task(ROOT / "examples" / "house_prices.py")
    config = PrecisionConfig(policy="mixed_float16",
                             loss_scale=LossScale("fixed", value=2.0**15))
    runs = {guard: _fit_task(task, config, epochs=3, guard=guard, verbose=0)
            for guard in (False, True)}
    unguarded, guarded = runs[False][1], runs[True][1]
    assert int(runs[False][0].optimizer.iterations.numpy()) == 0  # every update skipped
    watcher = runs[True][2]
    assert watcher.events[0].kind == "skipped_updates"
    assert "fixed loss scale lowered" in watcher.events[0].action
    assert watcher.config.loss_scale.kind == "fixed" and watcher.config.loss_scale.value < 1.0
    assert watcher.config.policy == "mixed_float16"
    assert int(runs[True][0].optimizer.iterations.numpy()) > 0
    assert guarded[-1] < unguarded[-1]


@pytest.mark.parametrize("guard", [False, True])
def test_nan_in_the_targets_is_the_datas_fault(guard):
    x, y = _regression()
    y[100:110] = np.nan  # batch 4 of every epoch
    model, _, watcher = _fit(BFLOAT16, keras.layers.Identity(), (x, y), guard=guard,
                             optimizer=keras.optimizers.Adam(1e-2), max_repairs=2)
    finite = all(np.all(np.isfinite(w)) for w in model.get_weights())
    if not guard:
        assert not finite
        return
    assert finite and len(watcher.events) == 3  # one skip an epoch, and no GuardError
    assert all("not precision" in event.action for event in watcher.events)
    assert watcher.repairs == 0 and watcher.config == BFLOAT16


def test_pure_float16_records_the_layers_for_next_time_and_stops_without_a_last_resort():
    """Under pure float16 the silent norms cannot move mid-training (16-bit weights): the guard
    records them in guard.config. This model's Adam state then overflows float16 (every
    layer's forward and backward finite, the update not): no layer repair exists, and under a
    pure policy there is no last resort, so the guard stops with GuardError, cleanly."""
    task = _task(ROOT / "tests" / "fixtures" / "tasks" / "silent_norm.py")
    config = PrecisionConfig(policy="float16", loss_scale=LossScale("dynamic", floor=1e-6))
    _, unguarded, _ = _fit_task(task, config, epochs=3, guard=False)
    assert not math.isfinite(unguarded[-1])
    guard = config.guard(verbose=0, check_budget=None)
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    with config.scope():
        model = task.build_model()
    model.compile(optimizer=config.wrap_optimizer(task.make_optimizer()), loss="mse",
                  **config.compile_kwargs())
    with pytest.raises(GuardError, match="Train with guard.config"):
        model.fit(*task.train_data(), batch_size=64, epochs=3, shuffle=False, verbose=0,
                  callbacks=[guard])
    assert "cannot move" in guard.events[0].action and guard.events[-1].kind == "gave_up"
    assert not any("last resort" in event.action for event in guard.events)
    assert set(guard.config.float32.layers) == {f"norm_{index}" for index in range(4)}
    assert guard.config.policy == "float16"
    assert not getattr(model.train_function, "_precision_guard", False)
    keras.backend.clear_session()
    with guard.config.scope():
        again = task.build_model()
    assert again.get_layer("norm_0").dtype_policy.name == "float32"
    assert again.get_layer("block_0").dtype_policy.name == "float16"
