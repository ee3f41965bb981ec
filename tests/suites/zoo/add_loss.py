"""A layer that adds its own loss with ``self.add_loss`` (Keras guide: activity regularization),
plus weight regularizers, in a Sequential model."""

import keras
import numpy as np

LOSS = "sparse_categorical_crossentropy"
BATCH_SIZE = 32


class ActivityRegularization(keras.layers.Layer):
    def __init__(self, rate=1e-2, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, inputs):
        self.add_loss(self.rate * keras.ops.mean(keras.ops.square(inputs)))
        return inputs


def build_model():
    return keras.Sequential([
        keras.Input(shape=(20,)),
        keras.layers.Dense(32, activation="relu", kernel_regularizer=keras.regularizers.l2(1e-4)),
        ActivityRegularization(),
        keras.layers.Dense(4, activation="softmax"),
    ])


def train_data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(512, 20)).astype("float32")
    y = np.argmax(x[:, :4], axis=1)
    return x, y
