"""A model with a "safe" norm feature on zero-padded rows, as people write it for embeddings:
``sqrt(sum(h^2) + 1e-12)``. A quarter of the rows are padding (all zeros).

In float16 the 1e-12 rounds to 0 and the square root's derivative at those rows' tiny sums is
huge: measured here (mixed_float16, 30 steps), a fixed loss scale of 2^15 overflowed the
gradients on 22 of 30 steps, while a dynamic scale backed off once and trained as float32 did.
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
    h = keras.layers.Dense(16)(inputs)
    x = WithNorm(name="with_norm")(h)
    outputs = keras.layers.Dense(1, dtype="float32")(x)
    return keras.Model(inputs, outputs)


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32 * 20, 8)).astype("float32")
    x[::4] = 0.0                                     # padding rows
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    return x, y
