"""y was filtered, x was not: 320 rows against 300."""

import keras
import numpy as np

LOSS = "mse"


def build_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def train_data():
    x = np.random.default_rng(0).normal(size=(320, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)[:300]
