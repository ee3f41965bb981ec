"""The guard's last resort (every layer in float32, once its repairs are spent) on a tiny
regressor whose targets pass float16's range and whose loss scale keeps collapsing (the case
tests/apply/test_apply_distribute.py runs under a strategy): the training goes on, and what it
learns from then on, its loss finite (an inf loss equals itself: ``math.isfinite`` is asked).
"""

from __future__ import annotations

import math

import keras
import numpy as np

from tuner import PrecisionConfig
from tuner.apply.config import LossScale


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
    # Learning in float32 (about 6% down by epoch 12 here; a step still in float16 skips
    # every update and the loss stays flat).
    assert losses[-1] < 0.98 * min(losses[:3]), losses
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
