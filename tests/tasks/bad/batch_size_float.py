"""BATCH_SIZE written as a float (a user who computed it: 64 / 2)."""

import keras
import numpy as np

LOSS = "mse"
BATCH_SIZE = 64 / 2


def build_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def train_data():
    x = np.random.default_rng(0).normal(size=(320, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)
