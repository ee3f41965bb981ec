"""Gradients that underflow in float16: the loss is scaled by 2^-30.

In float32 Adam does not care about the gradients' scale (its epsilon is set tiny here), so the
model learns. Under mixed_float16 the gradients (~1e-9) flush to zero in float16 and nothing is
learned, unless a loss scale lifts them back into range.
"""

import keras
import numpy as np

BATCH_SIZE = 32


def LOSS(y_true, y_pred):
    return 2.0**-30 * keras.losses.mean_squared_error(y_true, y_pred)


def build_model():
    inputs = keras.Input(shape=(8,))
    x = keras.layers.Dense(16, activation="tanh")(inputs)
    outputs = keras.layers.Dense(1, dtype="float32")(x)
    return keras.Model(inputs, outputs)


def make_optimizer():
    return keras.optimizers.Adam(1e-2, epsilon=1e-20)


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32 * 20, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    return x, y
