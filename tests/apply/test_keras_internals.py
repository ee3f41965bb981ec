"""tuner.apply.keras_internals at the installed Keras (``make test-lowest`` runs these at the
declared floor, ``make test`` at the newest): each version difference the seam handles."""

from __future__ import annotations

import keras
import numpy as np

from tuner.apply import keras_internals
from tuner.apply.loss_scaling import FixedLossScaleOptimizer, FlooredLossScaleOptimizer


def test_applied_updates_counts_what_a_loss_scale_optimizer_applied_not_what_it_skipped():
    # Before Keras 3.9 a LossScaleOptimizer's own ``iterations`` never moves: every step read
    # as skipped, and every float16 trial at Keras 3.5 as a collapsed loss scale.
    for optimizer in (keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
                      FlooredLossScaleOptimizer(keras.optimizers.SGD(0.1)),
                      FixedLossScaleOptimizer(keras.optimizers.SGD(0.1))):
        weight = keras.Variable(np.ones(3, "float32"))
        optimizer.build([weight])
        finite = keras.ops.convert_to_tensor(np.ones(3, "float32"))
        non_finite = keras.ops.convert_to_tensor(np.array([np.inf, 1, 1], "float32"))
        for gradient in (finite, non_finite, finite):
            optimizer.apply([gradient], [weight])
        assert keras_internals.applied_updates(optimizer) == 2, type(optimizer).__name__


def test_applied_updates_of_a_plain_optimizer_is_its_iterations():
    optimizer = keras.optimizers.Adam(1e-3)
    weight = keras.Variable(np.ones(2, "float32"))
    optimizer.build([weight])
    optimizer.apply([keras.ops.ones((2,))], [weight])
    assert keras_internals.applied_updates(optimizer) == 1


def test_a_floored_scale_halves_to_its_floor_on_non_finite_steps():
    # The optimizer's non-finite hook reaches the subclass under its public name.
    optimizer = FlooredLossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=8.0, floor=2.0)
    weight = keras.Variable(np.ones(1, "float32"))
    optimizer.build([weight])
    for _ in range(4):
        optimizer.apply([keras.ops.convert_to_tensor(np.array([np.nan], "float32"))], [weight])
    assert float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)) == 2.0
    assert float(keras.ops.convert_to_numpy(weight)[0]) == 1.0


def test_private_names_the_seam_declares_exist_at_this_keras():
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    assert len(keras_internals.own_variables(layer)) == 2
    assert layer in keras_internals.direct_sublayers(keras.Sequential([keras.Input((3,)), layer]))
    assert keras_internals.added_losses(layer) == []
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    assert keras_internals.compiled_loss(model) is not None
    assert keras_internals.compiled_loss_tracker(model).name == "loss"
    assert keras_internals.is_functional(model)
    for method in ("_tf_apply", "_stateful_handle_finite_grads",
                   "_stateful_handle_non_finite_grads"):
        assert hasattr(keras.optimizers.LossScaleOptimizer, method), method
    assert hasattr(keras.optimizers.Optimizer, keras_internals.VARIABLE_INDEX_METHOD)
