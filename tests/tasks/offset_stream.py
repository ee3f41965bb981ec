"""A pre-norm residual regressor whose stream carries a large offset: a stem whose bias starts
the stream at a baseline of 1000 (a pressure in hPa), three blocks that read the stream through
a LayerNormalization and add corrections of order one back to it, a final norm and a head.
bfloat16's step at 1000 is 8: the stem's outputs round the features' variation away and each
addition rounds the blocks' corrections away, though each of those layers' own output is within
1% of its float32 computation. The norms, which subtract the offset, and the head after them
are where the error shows; the layers at fault are the stem and the additions (and the norms
that read the stream, whose input cast to bfloat16 rounds it again).
"""

import keras
import numpy as np

BATCH_SIZE = 64
LOSS = "mse"


def _readings(count, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(count, 8)).astype("float32")
    w = np.random.default_rng(5).normal(size=(8,))
    target = np.tanh(z @ w / 2) + 0.5 * np.sin(2 * z[:, 0]) + rng.normal(scale=0.05, size=count)
    return z, target.astype("float32")


def train_data():
    return _readings(4096, 0)


def val_data():
    return _readings(1024, 1)


def make_optimizer():
    return keras.optimizers.Adam(1e-3)


def build_model():
    inputs = keras.Input(shape=(8,), name="features")
    h = keras.layers.Dense(32, bias_initializer=keras.initializers.Constant(1000.0),
                           name="stem")(inputs)
    for index in range(3):
        z = keras.layers.LayerNormalization(name=f"norm_{index}")(h)
        z = keras.layers.Dense(32, activation="relu", name=f"block_{index}_in")(z)
        z = keras.layers.Dense(32, name=f"block_{index}_out")(z)
        h = keras.layers.Add(name=f"add_{index}")([h, z])
    h = keras.layers.LayerNormalization(name="final_norm")(h)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(h), name="offset_stream")
