"""A residual regressor whose targets are in physical units (pressure, about 1e5 Pa): a stem,
three residual Dense blocks, a neck and a linear head. Kept as evidence for the guard (issue
51), not run by a test.

Measured (30 epochs, seed 0, 2-core CPU): float32 sits on a plateau near 3e7 for 12 epochs,
then ends at 2.6e6. Under mixed_float16 every update is skipped at the tuner's floor (1) and
the head's output overflows float16 later. With the guard and a floor of 1e-6 it ends at
2.66e6 (1.02x). With the guard and the floor at 1 it ends on the plateau (3.09e7): configured
from the start with the head in float32 it stays there too, at either floor; with the head and
the stem in float32 it leaves it. Which runs leave the plateau looks like chance, not a fault
a layer shows.
"""

import keras
import numpy as np

BATCH_SIZE = 64
LOSS = "mse"


def _readings(count, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(count, 10))
    w = np.random.default_rng(3).normal(size=(10,))
    pressure = (1.0e5 + 2.0e4 * np.tanh(z @ w / 3) + 3e3 * np.cos(z[:, 1])
                + rng.normal(scale=300, size=count))
    return z.astype("float32"), pressure.astype("float32")


def train_data():
    return _readings(8192, 0)


def val_data():
    return _readings(2048, 1)


def make_optimizer():
    return keras.optimizers.Adam(1e-2)


def build_model():
    inputs = keras.Input(shape=(10,))
    h = keras.layers.Dense(32, name="stem")(inputs)
    for index in range(3):
        block = keras.layers.Dense(32, activation="relu", name=f"block_{index}")(h)
        h = keras.layers.Add(name=f"add_{index}")([h, block])
    h = keras.layers.Dense(32, activation="relu", name="neck")(h)
    return keras.Model(inputs, keras.layers.Dense(1, name="pressure")(h))
