"""House values from raw map coordinates, written as the structured-data tutorials write it:
longitude and latitude go straight into a ``Normalization`` layer adapted on the training data,
then a wide MLP with a mean-squared-error head, and a held-out ``val_data()``.

The coordinates span a 0.7-degree area around (-122.15, 37.55): a large offset, a small spread.
"""

import keras
import numpy as np

BATCH_SIZE = 64
LOSS = "mse"
METRICS = ["mae"]


def _houses(count, seed):
    rng = np.random.default_rng(seed)
    longitude = rng.uniform(-122.5, -121.8, count)
    latitude = rng.uniform(37.2, 37.9, count)
    rooms = rng.gamma(5.0, 1.0, count)
    income = rng.lognormal(1.2, 0.4, count)
    # Value varies over a few kilometres (neighbourhoods), plus what rooms and income add.
    u, v = (longitude + 122.5) / 0.7, (latitude - 37.2) / 0.7
    value = (5.0 + 1.5 * np.sin(3 * np.pi * u) * np.cos(2 * np.pi * v) + 0.8 * u
             + 0.1 * rooms + 0.3 * income + rng.normal(0, 0.05, count))
    features = np.stack([longitude, latitude, rooms, income], axis=1).astype("float32")
    return features, value.astype("float32")


def build_model():
    normalize = keras.layers.Normalization(name="normalization")
    normalize.adapt(_houses(4096, 0)[0])
    inputs = keras.Input(shape=(4,), name="house")
    x = normalize(inputs)
    x = keras.layers.Dense(256, activation="relu")(x)
    x = keras.layers.Dense(256, activation="relu")(x)
    outputs = keras.layers.Dense(1, name="value")(x)
    return keras.Model(inputs, outputs, name="house_values")


def train_data():
    return _houses(8192, 0)


def val_data():
    return _houses(2048, 1)
