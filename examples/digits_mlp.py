"""An MLP on scikit-learn's bundled 8x8 digits: real data, no download.

Tune it:  precision-tuner tune examples/digits_mlp.py --space quick
"""

import keras
import numpy as np

BATCH_SIZE = 256
LOSS = "sparse_categorical_crossentropy"
METRICS = ["accuracy"]


def build_model():
    inputs = keras.Input(shape=(64,), name="pixels")
    x = keras.layers.Dense(1024, activation="relu")(inputs)
    x = keras.layers.Dense(1024, activation="relu")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="digit")(x)
    return keras.Model(inputs, outputs, name="digits_mlp")


def make_optimizer():
    return keras.optimizers.Adam(1e-3)


def train_data():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))  # fixed order, every trial alike
    return x[order], y[order]
