"""A log transform of a column with a zero in it: -inf in y."""

import keras
import numpy as np

LOSS = "mse"


def build_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def train_data():
    x = np.abs(np.random.default_rng(0).normal(size=(320, 4))).astype("float32")
    x[3, 0] = 0.0
    with np.errstate(divide="ignore"):
        y = np.log(x[:, :1])
    return x, y
