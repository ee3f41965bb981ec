"""A regression model compiled with a metric written as a plain function (the Keras guides'
``y_true - y_pred`` style). Under a mixed policy its predictions are 16-bit while the targets
are float32, and ``model.fit`` itself fails on the subtraction: Keras's advice is a model whose
outputs are float32."""

import keras
import numpy as np
from keras import ops

BATCH_SIZE = 32
LOSS = "mean_squared_error"


def mean_absolute_difference(y_true, y_pred):
    return ops.mean(ops.abs(y_true - y_pred), axis=-1)


METRICS = [mean_absolute_difference]


def build_model():
    inputs = keras.Input(shape=(12,))
    x = keras.layers.Dense(32, activation="relu")(inputs)
    x = keras.layers.Dense(32, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(2)(x))


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(384, 12)).astype("float32")
    y = np.stack([x[:, :4].sum(axis=1), np.tanh(x[:, 4:8]).mean(axis=1)], axis=1)
    return x, y.astype("float32")
