"""A weather station's two heads, both far from zero, in one functional model with dict outputs:
sea-level pressure in hPa (about 1013, where bfloat16's step is 8) and dew point in kelvin
(about 283, step 2), from shared layers with Keras's automatic names. Under mixed_bfloat16
both heads round their predictions by more than float32's whole error.
"""

import keras
import numpy as np

BATCH_SIZE = 64
LOSS = {"pressure": "mse", "dew_point": "mse"}


def _station(count, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(count, 10)).astype("float32")
    w = np.random.default_rng(17).normal(size=(2, 10))
    pressure = 1013 + 6 * np.tanh(z @ w[0] / 3) + rng.normal(scale=0.1, size=count)
    dew = 283 + 4 * np.sin(z @ w[1] / 4) + rng.normal(scale=0.1, size=count)
    return z, {"pressure": pressure.astype("float32"), "dew_point": dew.astype("float32")}


def train_data():
    return _station(4096, 0)


def val_data():
    return _station(1024, 1)


def make_optimizer():
    return keras.optimizers.Adam(3e-3)


def build_model():
    inputs = keras.Input(shape=(10,))
    h = keras.layers.Dense(64, activation="relu")(inputs)
    h = keras.layers.Dense(64, activation="relu")(h)
    return keras.Model(inputs, {
        "pressure": keras.layers.Dense(1, bias_initializer=keras.initializers.Constant(1013.0),
                                       name="pressure")(h),
        "dew_point": keras.layers.Dense(1, bias_initializer=keras.initializers.Constant(283.0),
                                        name="dew_point")(h)})
