"""Token ids that arrive as floats (read from a CSV with pandas), looked up by a custom
embedding layer: a vocabulary of 5000 words, above what float16 (2048) or bfloat16 (256)
holds exactly."""

import keras
import numpy as np
from keras import layers, ops

VOCAB = 5000
MAXLEN = 12
BATCH_SIZE = 32
LOSS = "sparse_categorical_crossentropy"
METRICS = ["accuracy"]


class TokenEmbedding(layers.Layer):
    def __init__(self, vocab_size, dim, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.dim = vocab_size, dim

    def build(self, input_shape):
        self.table = self.add_weight(shape=(self.vocab_size, self.dim),
                                     initializer="uniform", name="table")

    def call(self, ids):
        return ops.take(self.table, ops.cast(ids, "int32"), axis=0)


def build_model():
    inputs = keras.Input(shape=(MAXLEN,))
    x = TokenEmbedding(VOCAB, 16, name="token_embedding")(inputs)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(32, activation="relu")(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def make_optimizer():
    return keras.optimizers.Adam(3e-3)


def train_data():
    rng = np.random.default_rng(3)
    x = rng.integers(0, VOCAB, size=(512, MAXLEN)).astype("float32")
    x[:, 0] = VOCAB - 1
    y = (np.mean(x[:, 1:4], axis=1) > VOCAB / 2).astype("int32")
    return x, y
