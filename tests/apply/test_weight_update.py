"""Pure 16-bit weights that still move: stochastic rounding and compensated (Kahan) updates,
proved on the numbers directly."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tuner.apply.weight_update import stochastic_round, wrap


def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour():
    value = tf.fill((20000,), 1.0 + 0.3 * 2.0**-7)  # 30% of the way from 1 to the next bfloat16
    uniform = tf.random.stateless_uniform((20000,), seed=(1, 2))
    rounded = stochastic_round(value, "bfloat16", uniform).numpy().astype(np.float64)
    assert set(np.unique(rounded)) == {1.0, 1.0 + 2.0**-7}
    assert np.mean(rounded) == pytest.approx(1.0 + 0.3 * 2.0**-7, abs=2e-4)
    negative = stochastic_round(-value, "float16", uniform).numpy().astype(np.float64)
    assert np.mean(negative) == pytest.approx(-(1.0 + 0.3 * 2.0**-7), abs=2e-5)
    exact = stochastic_round(tf.constant([0.5, -3.0, 0.0]), "bfloat16", uniform[:3])
    assert exact.numpy().astype(np.float32).tolist() == [0.5, -3.0, 0.0]


def _many_tiny_updates(mode, steps=400, lr=1e-4):
    """SGD on a bfloat16 weight whose gradient is always 1: each update is -lr, far below
    bfloat16's spacing at 1.0 (2^-7); the exact result after ``steps`` updates is 1 - steps*lr."""
    weight = keras.Variable(np.ones((64,), np.float32), dtype="bfloat16")
    optimizer = wrap(keras.optimizers.SGD(learning_rate=lr), mode, seed=3)
    optimizer.build([weight])
    gradient = tf.ones((64,), tf.bfloat16)
    step = tf.function(lambda: optimizer.apply([gradient], [weight]))
    for _ in range(steps):
        step()
    return weight.numpy().astype(np.float64)


def test_round_to_nearest_loses_every_tiny_update():
    assert np.all(_many_tiny_updates("nearest") == 1.0)


def test_stochastic_updates_move_the_weight_by_their_sum_in_expectation():
    final = _many_tiny_updates("stochastic")
    assert np.mean(final) == pytest.approx(1.0 - 400 * 1e-4, abs=0.004)
    assert len(np.unique(final)) > 1  # each element drew its own random numbers


def test_compensated_updates_stay_within_one_spacing_of_the_sum():
    final = _many_tiny_updates("compensated")
    assert np.all(np.abs(final - (1.0 - 400 * 1e-4)) <= 2.0**-8)


def test_float32_weights_and_the_optimizers_own_slots_are_left_alone():
    weight = keras.Variable(np.ones((4,), np.float32))
    optimizer = wrap(keras.optimizers.Adam(1e-3), "stochastic")
    optimizer.build([weight])
    optimizer.apply([tf.ones((4,))], [weight])
    assert weight.numpy() == pytest.approx(np.full(4, 1.0 - 1e-3), rel=1e-4)


@pytest.mark.parametrize("mode, moves", [("nearest", False), ("stochastic", True),
                                         ("compensated", True)])
def test_adam_on_bfloat16_weights_moves_only_with_float32_arithmetic(mode, moves):
    # Keras does Adam's arithmetic in the weight's dtype: beta_2 = 0.999 rounds to 1.0 in
    # bfloat16, and the step size lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) is exactly 0.
    weight = keras.Variable(np.full((16,), 0.05, np.float32), dtype="bfloat16")
    optimizer = wrap(keras.optimizers.Adam(1e-3), mode, seed=1)
    optimizer.build([weight])
    step = tf.function(lambda: optimizer.apply([tf.ones((16,), tf.bfloat16)], [weight]))
    for _ in range(20):
        step()
    moved = np.abs(np.asarray(weight.numpy(), np.float64) - 0.05).max()
    assert (moved > 0.01) == moves, moved
    assert {v.dtype for v in optimizer.variables if len(v.shape)} == {"bfloat16"}  # slots 16-bit
