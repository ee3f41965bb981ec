"""Ten samples, a batch of 32."""

import keras
import numpy as np

LOSS = "mse"
BATCH_SIZE = 32


def build_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def train_data():
    x = np.random.default_rng(0).normal(size=(10, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)
