"""Attention pooling over time with the softmax written out by hand, as in many blog posts:
``exp(scores) / sum(exp(scores))``, without subtracting the maximum first.

The readings are raw sensor values (spread 5), so the scores reach about 20: exp(20) is 5e8, fine
in float32 and bfloat16 but far beyond float16's 65504, and inf / inf is NaN. The pooled output
itself is an average of the inputs: keeping this one layer in float32 repairs float16.
"""

import keras
import numpy as np
from keras import ops

BATCH_SIZE = 32
LOSS = "mse"


class SoftPool(keras.layers.Layer):
    def build(self, input_shape):
        self.score = self.add_weight(shape=(input_shape[-1], 1), initializer="glorot_uniform",
                                     name="score")

    def call(self, h):
        weights = ops.exp(ops.matmul(h, self.score))          # (batch, time, 1)
        weights = weights / ops.sum(weights, axis=1, keepdims=True)
        return ops.sum(weights * h, axis=1)                   # (batch, features)


def build_model():
    inputs = keras.Input(shape=(16, 8))
    pooled = SoftPool(name="soft_pool")(inputs)
    hidden = keras.layers.Dense(16, activation="relu")(pooled)
    return keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(hidden))


def train_data():
    rng = np.random.default_rng(0)
    x = (5.0 * rng.normal(size=(32 * 20, 16, 8))).astype("float32")
    y = x.mean(axis=(1, 2))[:, None].astype("float32") / 5.0
    return x, y
