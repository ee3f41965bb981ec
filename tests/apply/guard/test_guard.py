"""The guard on real trainings, each beside the same training without it (the failure the guard
repairs must show there, so each test fails with the guard disabled):

- a float16 head that overflows after some epochs (examples/house_prices.py, targets in
  dollars) trains 30 epochs to float32's validation loss, and the guard names the head;
- a NaN injected mid-training by a custom layer is survived with the weights restored;
- a loss scale collapsed by a burst of overflowing gradients is reset (not merely restored);
- a healthy mixed_bfloat16 training (dropout included) has the same loss history bit for bit,
  and the guard records no event.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tuner import PrecisionConfig
from tuner.apply.config import LossScale

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "house_prices.py"


def _houses():
    spec = importlib.util.spec_from_file_location("house_prices", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(config: PrecisionConfig, build, data, *, epochs: int, guard: bool, optimizer=None,
           loss="mse", batch_size=128, validation=None, **guard_options):
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    with config.scope():
        model = build()
    model.compile(optimizer=config.wrap_optimizer(optimizer or keras.optimizers.Adam(3e-3)),
                  loss=loss, **config.compile_kwargs())
    # Checks spaced by steps alone: the exact events asserted do not depend on the machine's load.
    guard_options.setdefault("check_budget", None)
    watcher = config.guard(**guard_options) if guard else None
    history = model.fit(*data, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
                        validation_data=validation, callbacks=[watcher] if watcher else [])
    return model, history.history, watcher


FLOAT16 = PrecisionConfig(policy="mixed_float16", loss_scale=LossScale("dynamic"))


@pytest.fixture(scope="module")
def houses():
    task = _houses()
    data, validation = task.train_data(), task.val_data()
    runs = {}
    for name, config, guard in (("float32", PrecisionConfig(), False),
                                ("float16", FLOAT16, False), ("guarded", FLOAT16, True)):
        runs[name] = _train(config, task.build_model, data, epochs=30, guard=guard,
                            validation=validation)
    return runs


def test_an_overflowing_float16_head_trains_to_float32s_loss_under_the_guard(houses):
    float32_val = houses["float32"][1]["val_loss"][-1]
    unguarded_val = houses["float16"][1]["val_loss"][-1]
    _, history, guard = houses["guarded"]
    assert not (unguarded_val <= 1.5 * float32_val)  # the failure, without the guard
    assert history["val_loss"][-1] <= 1.5 * float32_val
    assert all(math.isfinite(v) for v in history["val_loss"])
    assert any("price" in event.layers for event in guard.events)
    assert "price" in guard.config.float32.layers
    for event in guard.events:
        assert {"epoch", "step", "kind", "layers", "action"} <= set(event.to_dict())


def test_the_amended_config_round_trips_and_starts_the_next_training_repaired(houses, tmp_path):
    _, _, guard = houses["guarded"]
    path = guard.config.save(tmp_path / "repaired.json")
    again = PrecisionConfig.load(path)
    assert again == guard.config and again.provenance["guard_repairs"]
    keras.backend.clear_session()  # layer names as a fresh training process has them
    with again.scope():
        model = _houses().build_model()
    assert model.get_layer("price").dtype_policy.name == "float32"


# -- a NaN injected by a custom layer -----------------------------------------------------------
_CALLS = tf.Variable(0, trainable=False)  # outside the model: a restore must not replay it


class Flaky(keras.layers.Layer):
    """Identity, except that its 40th training call returns NaN (a bad kernel, a bad row)."""

    def call(self, inputs, training=None):
        if not training:
            return inputs
        _CALLS.assign_add(1)
        poison = tf.cast(tf.equal(_CALLS, 40), inputs.dtype) * np.nan
        return inputs + tf.where(tf.equal(_CALLS, 40), poison, tf.zeros_like(inputs))


def around(layer: keras.layers.Layer) -> keras.Model:
    """A small regressor with ``layer`` between its two Dense layers."""
    inputs = keras.Input(shape=(16,))
    x = layer(keras.layers.Dense(32, activation="relu")(inputs))
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def _flaky_model():
    return around(Flaky())


def _regression(rows=2048, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 16)).astype("float32")
    return x, (x @ rng.normal(size=16) + 0.1 * rng.normal(size=rows)).astype("float32")


@pytest.mark.parametrize("guard", [False, True])
def test_a_nan_injected_mid_training_is_survived_with_the_weights_restored(guard):
    _CALLS.assign(0)
    config = PrecisionConfig(policy="mixed_bfloat16")
    model, history, watcher = _train(config, _flaky_model, _regression(), epochs=3, guard=guard,
                                     optimizer=keras.optimizers.Adam(1e-2), batch_size=64,
                                     snapshot_every=10)
    finite = all(np.all(np.isfinite(w)) for w in model.get_weights())
    if not guard:  # without the guard the NaN reaches every weight and stays
        assert not finite and math.isnan(history["loss"][-1])
        return
    assert finite and history["loss"][-1] < history["loss"][0]
    event = watcher.events[0]
    assert event.kind == "non_finite_loss" and event.epoch == 2 and event.step == 40
    assert event.action.startswith("restored step 30")
    assert watcher.config == config  # not a precision fault: nothing placed


# -- a loss scale collapsed by a burst of overflowing gradients ---------------------------------
_BURST = tf.Variable(0, trainable=False)


@tf.custom_gradient
def _burst_gradient(x):
    _BURST.assign_add(1)
    # Every other step from 31 to 60 overflows: 15 skips halve 2^15 to the floor, never two in a
    # row, so snapshots are taken on the way down (each with a lower scale than the last).
    in_burst = tf.logical_and(tf.logical_and(_BURST > 30, _BURST <= 60), _BURST % 2 == 1)

    def grad(upstream):
        return upstream * tf.where(in_burst, tf.constant(np.inf, upstream.dtype),
                                   tf.constant(1, upstream.dtype))

    return tf.identity(x), grad


class Bursty(keras.layers.Layer):
    def call(self, inputs, training=None):
        return _burst_gradient(inputs) if training else inputs


def _bursty_model():
    return around(Bursty())


@pytest.mark.parametrize("guard", [False, True])
def test_a_collapsed_loss_scale_is_reset(guard):
    _BURST.assign(0)
    model, _, watcher = _train(FLOAT16, _bursty_model, _regression(), epochs=3, guard=guard,
                               optimizer=keras.optimizers.Adam(1e-3), batch_size=64,
                               snapshot_every=5)
    scale = float(model.optimizer.dynamic_scale.numpy())
    if not guard:  # the burst is over, but the scale stays at its floor (growth: 2000 steps)
        assert scale == FLOAT16.loss_scale.floor
        return
    # The last snapshot before the trip holds the collapsed scale: only the reset brings it up,
    # to the largest power of two the batch's gradients fit (2^15 overflows this model's).
    assert scale >= 2.0**8 * FLOAT16.loss_scale.floor
    assert [event.kind for event in watcher.events] == ["scale_collapsed"]
    assert "loss scale reset" in watcher.events[0].action


# -- a healthy training is untouched ------------------------------------------------------------
def _digits_model():
    inputs = keras.Input(shape=(16,))
    x = keras.layers.Dense(64, activation="relu")(inputs)
    x = keras.layers.Dropout(0.2)(x)
    x = keras.layers.LayerNormalization()(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def test_a_healthy_training_has_the_same_history_bit_for_bit_and_no_event():
    config = PrecisionConfig(policy="mixed_bfloat16")
    data, validation = _regression(), _regression(512, seed=1)
    _, plain, _ = _train(config, _digits_model, data, epochs=4, guard=False,
                         validation=validation, batch_size=32)
    _, guarded, watcher = _train(config, _digits_model, data, epochs=4, guard=True,
                                 validation=validation, batch_size=32, snapshot_every=7)
    assert guarded == plain
    assert watcher.events == [] and watcher.repairs == 0
    assert len(watcher.history) == 4 and watcher.snapshot_bytes > 0


def test_kerass_own_mixed_float16_overflow_is_named_at_the_head_and_repaired(houses):
    """The issue's case as a new user meets it: Keras's own loss scale (no floor, added by
    compile), the head's float16 predictions passing 65504 some epochs in."""
    task = _houses()
    data, validation = task.train_data(), task.val_data()
    float32_val = houses["float32"][1]["val_loss"][-1]
    runs = {}
    for guard in (False, True):
        keras.utils.set_random_seed(0)
        keras.backend.clear_session()
        with FLOAT16.scope():
            model = task.build_model()
        model.compile(optimizer=task.make_optimizer(), loss="mse")  # Keras adds its scale
        watcher = FLOAT16.guard(check_budget=None) if guard else None
        history = model.fit(*data, batch_size=128, epochs=30, shuffle=False, verbose=0,
                            validation_data=validation, callbacks=[watcher] if watcher else [])
        runs[guard] = history.history["val_loss"], watcher
    assert not math.isfinite(runs[False][0][-1])  # inf, then nan, to the end
    val_losses, watcher = runs[True]
    assert val_losses[-1] <= 1.5 * float32_val
    overflow = [event for event in watcher.events if event.kind == "non_finite_loss"]
    assert overflow and overflow[0].layers == ("price",) and overflow[0].epoch > 2
    assert "moved price to float32" in overflow[0].action
