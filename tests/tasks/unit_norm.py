"""Keras's own ``UnitNormalization`` in pre-norm residual blocks, layers named by Keras, on raw
readings in their units (flows around 400 m³/h) and a head predicting energy in kWh (about
5000). Under mixed_float16 the stem's outputs are in the hundreds, so the norm's sum of squares
passes 65504, its reciprocal square root is 0 and every norm outputs exact zeros: the blocks
add nothing, nothing is NaN, and the model ends worse than float32. Only each norm's float16
output against its float32 computation on the same input shows it.
"""

import keras
import numpy as np

BATCH_SIZE = 64
LOSS = "mse"


def _readings(count, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(count, 16))
    w = np.random.default_rng(11).normal(size=(16,))
    energy = (5000 + 1500 * np.tanh(z @ w / 4) + 300 * z[:, 2] ** 2
              + rng.normal(scale=50, size=count))
    return (400 + 30 * z).astype("float32"), energy.astype("float32")


def train_data():
    return _readings(8192, 0)


def val_data():
    return _readings(2048, 1)


def make_optimizer():
    return keras.optimizers.Adam(1e-2)


def build_model():
    inputs = keras.Input(shape=(16,))
    h = keras.layers.Dense(48)(inputs)
    for _ in range(3):
        z = keras.layers.UnitNormalization()(h)
        z = keras.layers.Dense(96, activation="relu")(z)
        h = keras.layers.Add()([h, keras.layers.Dense(48)(z)])
    return keras.Model(inputs, keras.layers.Dense(1)(h))
