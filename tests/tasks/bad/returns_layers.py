"""build_model() returns the list of layers instead of a model."""

import keras
import numpy as np

LOSS = "mse"


def build_model():
    return [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)]


def train_data():
    x = np.random.default_rng(0).normal(size=(320, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)
