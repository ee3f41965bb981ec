"""Layers that make their own weights in build(), as in Keras's "making new layers" guide: a
linear layer and an RMS normalization layer, used in a fully subclassed model."""

import keras
import numpy as np
from keras import ops

BATCH_SIZE = 32
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
METRICS = [keras.metrics.SparseCategoricalAccuracy()]


class Linear(keras.layers.Layer):
    def __init__(self, units=32, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units),
                                 initializer="random_normal", trainable=True)
        self.b = self.add_weight(shape=(self.units,), initializer="zeros", trainable=True)

    def call(self, inputs):
        return ops.matmul(inputs, self.w) + self.b


class RMSNorm(keras.layers.Layer):
    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        mean_square = ops.mean(ops.square(x), axis=-1, keepdims=True)
        return x * ops.rsqrt(mean_square + self.epsilon) * self.scale


class MLP(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.linear_1 = Linear(32)
        self.norm = RMSNorm()
        self.linear_2 = Linear(3)

    def call(self, inputs):
        x = keras.activations.relu(self.linear_1(inputs))
        return self.linear_2(self.norm(x))


def build_model():
    return MLP()


def make_optimizer():
    return keras.optimizers.Adam(1e-2)


def train_data():
    rng = np.random.default_rng(9)
    x = rng.normal(size=(512, 12)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 0] > 1).astype("int32")
    return x, y
