"""House prices in dollars: a regression whose targets stay in physical units.

Inputs go through a ``Normalization`` layer; the targets (about 1.7e5-3.3e5 dollars) are not
scaled, as a new user leaves them. float32 trains to the end. Under Keras's own
``mixed_float16`` the head's predictions pass float16's largest value (65504) after a few
epochs and the loss is inf, then nan, to the end: a 100-step trial never sees it.

    precision-tuner tune examples/house_prices.py --space quick

and, with an exported config, train under the guard (README: "Apply the result").
"""

import keras
import numpy as np

BATCH_SIZE = 128
LOSS = "mse"
_SCALES = np.array([1, 10, 100, 5, 2, 3, 50, 2], "float32")


def _houses(count: int, seed: int):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(count, 8)).astype("float32")
    weights = np.random.default_rng(1).normal(size=8)
    price = 2.5e5 + 8e4 * np.tanh(features @ weights / 2) + rng.normal(scale=2e4, size=count)
    return features * _SCALES, price.astype("float32")


def train_data():
    return _houses(8192, 0)


def val_data():
    return _houses(2048, 2)


def make_optimizer():
    return keras.optimizers.Adam(3e-3)


def build_model():
    normalize = keras.layers.Normalization()
    normalize.adapt(train_data()[0])
    inputs = keras.Input(shape=(8,), name="features")
    x = normalize(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(1, name="price")(x)
    return keras.Model(inputs, outputs, name="house_prices")
