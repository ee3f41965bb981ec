"""A norm feature of zero-padded rows, written with a "safe" epsilon: ``sqrt(sum(h^2) + 1e-12)``.
The projection has no bias (as in many embedding heads), so the padding rows stay exactly zero.

In float32 the epsilon keeps the square root's derivative finite (5e5, times a zero). In
float16 the 1e-12 rounds to 0, the derivative at 0 is infinite, and infinity times zero is NaN:
the gradients are NaN on every step *whatever the loss scale*, so a dynamic scale halves on
every step without ever recovering: it collapses. (With a loss scale that did nothing, the NaN
updates would be applied and the loss itself would go NaN.)
"""

import keras
import numpy as np
from keras import ops

BATCH_SIZE = 32
LOSS = "mse"


class WithNorm(keras.layers.Layer):
    """Appends each row's Euclidean norm as one more feature."""

    def call(self, h):
        norm = ops.sqrt(ops.sum(ops.square(h), axis=-1, keepdims=True) + 1e-12)
        return ops.concatenate([h, norm], axis=-1)


def build_model():
    inputs = keras.Input(shape=(8,))
    h = keras.layers.Dense(16, use_bias=False)(inputs)
    x = WithNorm(name="with_norm")(h)
    outputs = keras.layers.Dense(1, dtype="float32")(x)
    return keras.Model(inputs, outputs)


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32 * 20, 8)).astype("float32")
    x[::4] = 0.0                                     # padding rows
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    return x, y
