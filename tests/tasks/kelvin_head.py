"""A regressor whose output sits far from zero: air temperature in kelvin (about 290) from a
dozen weather features. bfloat16 keeps 8 bits of mantissa, so its step at 290 is 2: a head
computed in bfloat16 rounds every prediction by up to 1 K, while float32 fits the targets to
a few tenths. Nothing is non-finite and no layer is off by more than 1%; the model's loss on
a batch, as it runs against the same weights in float32, shows it.
"""

import keras
import numpy as np

BATCH_SIZE = 64
LOSS = "mse"


def _weather(count, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(count, 12)).astype("float32")
    w = np.random.default_rng(3).normal(size=(12,))
    kelvin = 290 + 8 * np.tanh(z @ w / 3) + 2 * np.sin(z[:, 1]) + rng.normal(scale=0.1,
                                                                              size=count)
    return z, kelvin.astype("float32")


def train_data():
    return _weather(4096, 0)


def val_data():
    return _weather(1024, 1)


def make_optimizer():
    return keras.optimizers.Adam(3e-3)


def build_model():
    inputs = keras.Input(shape=(12,), name="weather")
    h = keras.layers.Dense(64, activation="relu", name="hidden_0")(inputs)
    h = keras.layers.Dense(64, activation="relu", name="hidden_1")(h)
    outputs = keras.layers.Dense(1, bias_initializer=keras.initializers.Constant(290.0),
                                 name="kelvin")(h)
    return keras.Model(inputs, outputs, name="air_temperature")
