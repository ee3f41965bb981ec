"""A tiny, fast task: an MLP on a learnable synthetic problem."""

import keras
import numpy as np

BATCH_SIZE = 32
LOSS = "sparse_categorical_crossentropy"


def build_model():
    inputs = keras.Input(shape=(16,))
    x = keras.layers.Dense(32, activation="relu")(inputs)
    x = keras.layers.LayerNormalization()(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def make_optimizer():
    return keras.optimizers.Adam(1e-2)


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32 * 20, 16)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32")
    return x, y
