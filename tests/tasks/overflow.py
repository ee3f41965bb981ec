"""Activations that overflow float16: a custom layer amplifies its input past 65504."""

import keras
import numpy as np

LOSS = "mse"
BATCH_SIZE = 32


class Amplify(keras.layers.Layer):
    def call(self, x):
        return x * 20000.0  # reaches ~2e5: fine in float32 and bfloat16, inf in float16


def build_model():
    inputs = keras.Input((8,))
    x = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    x = Amplify(name="amplify")(x)
    x = keras.layers.Dense(16, activation="relu", name="squash")(x)
    return keras.Model(inputs, keras.layers.Dense(1, name="out")(x))


def make_optimizer():
    return keras.optimizers.Adam(1e-3)


def train_data():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(640, 8)) * 4).astype("float32")
    y = np.tanh(x[:, :1]).astype("float32")
    return x, y
