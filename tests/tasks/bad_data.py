"""train_data() returns the wrong structure."""

import keras

LOSS = "mse"


def build_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def train_data():
    return {"x": [1, 2, 3]}
