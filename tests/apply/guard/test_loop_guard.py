"""The guard in a custom training loop (``cfg.loop_guard``), each case beside the same loop
without it, so that each test fails where the guard's repair is missing:

- a float16 head that overflows (examples/house_prices.py, targets in dollars) in a loop of
  ``tf.GradientTape`` steps: unguarded the loss scale sinks and the model learns nothing (a
  finite loss, 40x float32's); guarded, it trains to float32's validation loss and the head is
  named and moved to float32, in the same events ``fit``'s guard gives (also under XLA);
- a NaN injected mid-training: unguarded it reaches every weight; guarded, the step's weights
  are restored and the loop goes on;
- a GAN's two optimizers at a loss scale every gradient overflows at (examples/gan_loop.py):
  unguarded no update is ever applied; guarded, both scales are lowered in one trip;
- a healthy loop has the same losses bit for bit and no event; a loop whose optimizer is not
  wrapped as the config was tuned is refused in one line before its first step.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.apply.guard.test_guard import _CALLS, Flaky, _houses, _regression, around
from tests.apply.guard.test_repairs import ROOT, _task
from tuner import PrecisionConfig
from tuner.apply.config import LossScale
from tuner.errors import ConfigError

pytestmark = pytest.mark.slow
FLOAT16 = PrecisionConfig(policy="mixed_float16", loss_scale=LossScale("dynamic"))
_mse = keras.losses.MeanSquaredError()


def regression_step(model, optimizer, batch):
    """The custom loop's step, as the Keras guide writes one, loss-scaled."""
    x, y = batch
    with tf.GradientTape() as tape:
        loss = _mse(y, model(x, training=True))
        scaled = optimizer.scale_loss(loss)
    gradients = tape.gradient(scaled, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


def _loop(config, build, data, *, epochs, guard, learning_rate=3e-3, batch_size=128,
          validation=None, wrap=True, **options):
    """``epochs`` of a plain loop (the step in a ``tf.function``) or of the guarded one; the
    model, each step's loss, each epoch's validation loss and the guard."""
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    with config.scope():
        model = build()
    optimizer = keras.optimizers.Adam(learning_rate)
    optimizer = config.wrap_optimizer(optimizer) if wrap else optimizer
    batches = tf.data.Dataset.from_tensor_slices(data).batch(batch_size)
    losses, val_losses, watcher = [], [], None
    if guard:
        options.setdefault("check_budget", None)   # the events do not depend on the load
        watcher = config.loop_guard(model, optimizer, regression_step, epochs=epochs,
                                    steps_per_epoch=len(batches), verbose=0, **options)
        step = watcher.step
    else:
        step = tf.function(lambda batch: regression_step(model, optimizer, batch))
    for _ in range(epochs):
        for batch in batches:
            losses.append(float(step(batch)))
        val_loss = float(_mse(validation[1], model(validation[0]))) if validation else None
        val_losses.append(val_loss)
        if watcher is not None:
            watcher.end_epoch(val_loss=val_loss)
    if watcher is not None:
        watcher.close()
    return model, losses, val_losses, watcher


@pytest.fixture(scope="module")
def houses():
    task = _houses()
    data, validation = task.train_data(), task.val_data()
    return {name: _loop(config, task.build_model, data, epochs=30, guard=guard,
                        validation=validation, **options)
            for name, config, guard, options in (
                ("float32", PrecisionConfig(), False, {}), ("float16", FLOAT16, False, {}),
                ("guarded", FLOAT16, True, {}),
                ("guarded_xla", FLOAT16, True, {"jit_compile": True}))}


@pytest.mark.parametrize("guarded", ["guarded", "guarded_xla"])
def test_an_overflowing_float16_head_in_a_custom_loop_trains_to_float32s_loss(houses, guarded):
    float32_val = houses["float32"][2][-1]
    assert not houses["float16"][2][-1] <= 10 * float32_val   # the failure, unguarded
    model, losses, val_losses, guard = houses[guarded]
    assert val_losses[-1] <= 1.5 * float32_val, (val_losses[-1], float32_val)
    assert all(math.isfinite(value) for value in val_losses)
    assert "price" in guard.config.float32.layers
    assert model.get_layer("price").dtype_policy.name == "float32"
    kinds = {event.kind for event in guard.events}
    assert kinds <= {"scale_at_floor", "non_finite_loss", "skipped_updates"}, kinds
    assert guard.history[-1]["val_loss"] == pytest.approx(val_losses[-1])
    assert not hasattr(model, "_precision_tuner_own_step")   # the model's own step back


def test_a_nan_in_a_custom_loop_is_survived_with_the_weights_restored():
    runs = {}
    for guard in (False, True):
        _CALLS.assign(0)
        runs[guard] = _loop(PrecisionConfig(policy="mixed_bfloat16"), lambda: around(Flaky()),
                            _regression(), epochs=3, guard=guard, learning_rate=1e-2,
                            batch_size=64, snapshot_every=10)
    model, losses, _, _ = runs[False]
    assert math.isnan(losses[-1])
    assert not all(np.all(np.isfinite(w)) for w in model.get_weights())
    model, losses, _, guard = runs[True]
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
    assert math.isfinite(losses[-1]) and losses[-1] < losses[0]
    event = guard.events[0]
    assert event.kind == "non_finite_loss" and event.step == 40 and event.epoch == 2
    assert event.action.startswith("restored step 30")


def test_a_healthy_custom_loop_is_untouched():
    config = PrecisionConfig(policy="mixed_bfloat16")
    build = _houses().build_model
    data = _regression(1024)
    data = (data[0][:, :8], data[1])   # house_prices' 8 features
    _, plain, _, _ = _loop(config, build, data, epochs=2, guard=False)
    _, guarded, _, guard = _loop(config, build, data, epochs=2, guard=True, check_every=4)
    assert guarded == plain   # bit for bit
    assert guard.events == [] and len(guard.history) == 2


def test_both_optimizers_of_a_gan_loop_are_repaired_in_one_trip():
    example = _task(ROOT / "examples" / "gan_loop.py")
    config = PrecisionConfig(policy="mixed_float16",
                             loss_scale=LossScale("fixed", value=2.0**30))
    keras.utils.set_random_seed(0)
    with config.scope():
        model = example.build_model()
    optimizer = {name: config.wrap_optimizer(opt)
                 for name, opt in example.make_optimizer().items()}
    frozen = tf.function(lambda batch: example.train_step(model, optimizer, batch))
    for batch in tf.data.Dataset.from_tensor_slices(example.train_data()[:640]).batch(64):
        frozen(batch)
    assert {name: int(opt.iterations) for name, opt in optimizer.items()} == \
        {"generator": 0, "discriminator": 0}   # unguarded: every update skipped

    model, guard = example.train(config, epochs=1, verbose=0)
    assert [event.kind for event in guard.events] == ["skipped_updates"]
    event = guard.events[0]
    assert event.step == 1
    for name in ("generator_optimizer", "discriminator_optimizer"):
        assert f"{name}: fixed loss scale lowered" in event.action
    assert guard.config.loss_scale.value < 2.0**30
    assert guard.history[0]["skipped_steps_generator_optimizer"] == 1   # the first alone


def test_an_optimizer_not_wrapped_as_tuned_is_refused_before_the_first_step():
    task = _houses()
    with pytest.raises(ConfigError, match="applies no loss scale, but the config was tuned "
                                          "with a dynamic loss scale"):
        _loop(FLOAT16, task.build_model, task.train_data(), epochs=1, guard=True, wrap=False)


def test_a_step_returning_nothing_is_refused_in_one_line():
    model = around(keras.layers.Identity())
    guard = PrecisionConfig().loop_guard(model, keras.optimizers.Adam(), lambda m, o, b: None)
    with pytest.raises(ConfigError, match="the training step returned None"):
        guard.step((np.zeros((4, 16), "float32"), np.zeros((4,), "float32")))
