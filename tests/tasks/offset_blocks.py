"""The offset stream written as a subclassed model with blocks of its own: each ``OffsetBlock``
adds its correction with a raw ``h + z`` inside its ``call`` (no ``Add`` layer to place), the
stream starts at a baseline of 2000 (bfloat16's step there is 16), and the layers carry Keras's
automatic names. The rounding is in the stem and in the blocks' own addition.
"""

import keras
import numpy as np

BATCH_SIZE = 64
LOSS = "mse"


@keras.saving.register_keras_serializable(package="tests")
class OffsetBlock(keras.layers.Layer):
    def __init__(self, width, **kwargs):
        super().__init__(**kwargs)
        self.norm = keras.layers.LayerNormalization()
        self.inner = keras.layers.Dense(width, activation="relu")
        self.outer = keras.layers.Dense(width)

    def call(self, h):
        return h + self.outer(self.inner(self.norm(h)))


class Regressor(keras.Model):
    def __init__(self, width=32, blocks=2, **kwargs):
        super().__init__(**kwargs)
        self.stem = keras.layers.Dense(width, bias_initializer=keras.initializers.Constant(2000.0))
        self.blocks = [OffsetBlock(width) for _ in range(blocks)]
        self.norm = keras.layers.LayerNormalization()
        self.head = keras.layers.Dense(1)

    def call(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def _data(count, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(count, 6)).astype("float32")
    w = np.random.default_rng(11).normal(size=(6,))
    target = np.tanh(z @ w / 2) + 0.5 * np.cos(z[:, 2]) + rng.normal(scale=0.05, size=count)
    return z, target.astype("float32")


def train_data():
    return _data(4096, 0)


def val_data():
    return _data(1024, 1)


def make_optimizer():
    return keras.optimizers.Adam(1e-3)


def build_model():
    return Regressor()
