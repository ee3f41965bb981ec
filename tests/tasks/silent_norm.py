"""A residual regressor written as a user writes one: raw sensor readings in their units (around
290, kelvin-like) into a stem, four pre-norm residual blocks with a hand-written RMS norm
(``x * rsqrt(mean(x^2) + eps)``), a head predicting power in kilowatts (about 2000).

Under mixed_float16 the stem's outputs are in the hundreds, so ``mean(x^2)`` passes 65504 and
is inf, ``rsqrt(inf)`` is 0, and every norm outputs exact zeros: the blocks add nothing. Nothing
is NaN, no update is skipped, the loss stays finite and ends worse than float32's. Only each
norm's float16 output against its float32 computation on the same input shows it.
"""

import keras
import numpy as np
from keras import ops

BATCH_SIZE = 64
LOSS = "mse"


class RMSNorm(keras.layers.Layer):
    def build(self, shape):
        self.gain = self.add_weight(shape=(shape[-1],), initializer="ones", name="gain")

    def call(self, x):
        return x * ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + 1e-6) * self.gain


def _readings(count, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(count, 12))
    w = np.random.default_rng(7).normal(size=(12,))
    power = (2000 + 600 * np.tanh(z @ w / 3) + 150 * np.sin(2 * z[:, 0])
             + rng.normal(scale=20, size=count))
    return (290 + 15 * z).astype("float32"), power.astype("float32")


def train_data():
    return _readings(8192, 0)


def val_data():
    return _readings(2048, 1)


def make_optimizer():
    return keras.optimizers.Adam(3e-3)


def build_model():
    inputs = keras.Input(shape=(12,), name="readings")
    h = keras.layers.Dense(64, name="stem")(inputs)
    for index in range(4):
        z = RMSNorm(name=f"norm_{index}")(h)
        h = keras.layers.Add()([h, keras.layers.Dense(64, activation="relu",
                                                      name=f"block_{index}")(z)])
    return keras.Model(inputs, keras.layers.Dense(1, name="power_kw")(h), name="plant_power")
