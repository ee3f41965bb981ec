"""A 10-block residual Dense regressor on raw readings of about 1000, with two inputs of about
1e-21 (a dead sensor's noise): issue 62's diagnostics case. Every layer receives features
16-bit rounding erases (a large offset, a small spread), so the diagnostics have a finding for
each of its 22 layers; float16 rounds the two tiny inputs to zero, which the float32 model
cannot use either. tests/tasks/raw_residual.diagnostics.json is its diagnostics, as
``precision-tuner diagnose tests/tasks/raw_residual.py --json FILE`` wrote them."""

import keras
import numpy as np

LOSS = "mse"
BATCH_SIZE = 64


def build_model():
    inputs = keras.Input((8,))
    x = keras.layers.Dense(32, name="stem")(inputs)
    for block in range(10):
        update = keras.layers.Dense(32, activation="relu", name=f"block_{block}")(x)
        x = keras.layers.Add(name=f"add_{block}")([x, update])
    return keras.Model(inputs, keras.layers.Dense(1, name="out")(x))


def make_optimizer():
    return keras.optimizers.Adam(1e-4)


def train_data():
    rng = np.random.default_rng(0)
    readings = 1000 + rng.normal(size=(2048, 6)) * 2
    dead_sensor = rng.normal(size=(2048, 2)) * 1e-21
    x = np.concatenate([readings, dead_sensor], axis=1).astype("float32")
    y = ((readings[:, :1] - 1000) / 2).astype("float32")
    return x, y
