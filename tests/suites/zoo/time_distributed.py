"""Sequence tagging: a GRU over time steps, then TimeDistributed(Dense(..., softmax)) giving a
tag distribution per step."""

import keras
import numpy as np

STEPS = 10
FEATURES = 6
TAGS = 4
BATCH_SIZE = 32
LOSS = "sparse_categorical_crossentropy"


def build_model():
    return keras.Sequential([
        keras.Input(shape=(STEPS, FEATURES)),
        keras.layers.Conv1D(16, 3, padding="same", activation="relu"),
        keras.layers.GRU(16, return_sequences=True),
        keras.layers.TimeDistributed(keras.layers.Dense(TAGS, activation="softmax")),
    ])


def train_data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(384, STEPS, FEATURES)).astype("float32")
    y = np.argmax(x[:, :, :TAGS], axis=-1).astype("int32")
    return x, y
