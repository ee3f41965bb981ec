"""The guard's last resort (every layer in float32, once its repairs are spent), on tiny models
(seconds: the quick tier):

- a failure no repair can fix (a custom op that turns NaN from its 20th call, whatever the
  precision): the last resort ends it under a mixed policy, by the route that fired;
  ``GuardError`` under a pure policy, where there is no last resort; either way the guard takes
  its step wrapper off the model when it stops;
- a regressor whose targets pass float16's range and whose loss scale keeps collapsing (the case
  tests/apply/test_apply_distribute.py runs under a strategy): after the last resort the
  training goes on and learns, its loss finite (an inf loss equals itself: ``math.isfinite``).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tuner import PrecisionConfig
from tuner.apply.config import LossScale
from tuner.errors import GuardError


# -- out of repairs: the last resort, then GuardError -------------------------------------------
class AlwaysNaN(keras.layers.Layer):
    """From its 20th training call on, NaN whatever the precision (a broken custom op)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = tf.Variable(0, trainable=False)

    def call(self, inputs, training=None):
        if not training:
            return inputs
        self.calls.assign_add(1)
        return inputs * tf.where(self.calls >= 20, tf.constant(np.nan, inputs.dtype),
                                 tf.constant(1, inputs.dtype))


def _always_nan_training(policy: str, **guard_options):
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    config = PrecisionConfig(policy=policy)
    with config.scope():
        inputs = keras.Input(shape=(8,))
        x = AlwaysNaN(name="broken")(keras.layers.Dense(16)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer=config.wrap_optimizer(keras.optimizers.Adam(1e-3)), loss="mse")
    guard = config.guard(verbose=0, check_budget=None, **guard_options)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(1024, 8)).astype("float32"), rng.normal(size=1024).astype("float32")
    return model, guard, lambda: model.fit(x, y, batch_size=32, epochs=5, verbose=0,
                                           callbacks=[guard])


@pytest.mark.parametrize("max_repairs, route", [
    (1, "last resort: 1 repairs spent"),                                   # OutOfRepairs
    (3, "last resort: the failure came back with nothing to repair")])     # NothingRepaired
def test_the_last_resort_ends_the_watch_by_the_route_that_fired(max_repairs, route):
    """Under a mixed policy the last resort (every layer in float32) ends the failure: the
    training goes on as a float32 one, no GuardError after it (a NaN in float32 is not a
    precision failure). Which route fired is asserted: out of repairs (``OutOfRepairs``) where
    one repair is allowed, the failure back with nothing to repair (``NothingRepaired``) where
    three are. Mutation caught: ``OutOfRepairs`` stopping (``End.STOP``) under a mixed policy
    too, or either route's last resort removed."""
    model, guard, fit = _always_nan_training("mixed_bfloat16", max_repairs=max_repairs)
    fit()
    actions = [event.action for event in guard.events]
    assert route in actions[-1], actions
    assert sum("last resort" in action for action in actions) == 1 and len(actions) <= 4
    assert not any(event.kind == "gave_up" for event in guard.events)
    assert guard.config.policy == "float32"
    assert not getattr(model.train_function, "_precision_guard", False)


def test_guard_error_is_left_to_pure_policies():
    """Under a pure policy, where no last resort exists, GuardError."""
    model, guard, fit = _always_nan_training("bfloat16", max_repairs=3)
    with pytest.raises(GuardError, match="after 3 repairs"):
        fit()
    assert guard.events[-1].kind == "gave_up"
    assert not getattr(model.train_function, "_precision_guard", False)


def test_after_the_last_resort_the_training_computes_in_float32_and_its_loss_is_finite():
    """Mutation caught: the last resort moves every layer to float32 without tracing the step
    anew (tuner/apply/guard/training.py ``last_resort``): the policies say float32 while the
    traced step still computes in float16, where every update overflows and is skipped: the
    loss stays where it was."""
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    config = PrecisionConfig(policy="mixed_float16", loss_scale=LossScale("dynamic"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 16)).astype("float32")
    y = (x @ rng.normal(size=16) * 3e4).astype("float32")   # past float16's 65504
    with config.scope():
        inputs = keras.Input((16,))
        hidden = keras.layers.Dense(32, activation="relu")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(1, name="price")(hidden))
    model.compile(optimizer=config.wrap_optimizer(keras.optimizers.Adam(0.1)), loss="mse",
                  **config.compile_kwargs())
    guard = config.guard(max_repairs=1, verbose=0)
    history = model.fit(x, y, batch_size=128, epochs=12, verbose=0, callbacks=[guard])
    assert "every layer to float32" in guard.events[-1].action, \
        [event.line() for event in guard.events]
    assert guard.config.policy == "float32"
    assert {layer.dtype_policy.name for layer in model.layers[1:]} == {"float32"}
    losses = history.history["loss"]
    assert all(math.isfinite(loss) for loss in losses), losses
    # Learning in float32 after it: down every epoch (a step still in float16 skips every
    # update, and the loss stays where it was, the same each epoch). Counted from the first
    # whole epoch after the last resort: when it comes depends on the guard's time budgets
    # (epoch 2 or 9 here: a loaded machine spaces its checks and snapshots otherwise), and the
    # epoch it came in holds only the steps before it (tests/apply/guard/test_step_ledger.py).
    after = guard.events[-1].epoch     # 1-based: the index of the next epoch
    assert after <= len(losses) - 3, [event.line() for event in guard.events]
    assert all(later < earlier for earlier, later in zip(losses[after:], losses[after + 1:])), \
        losses
    assert losses[-1] < 0.99 * losses[after], losses
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
