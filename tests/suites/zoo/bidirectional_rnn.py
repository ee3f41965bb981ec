"""Text classification as in Keras's examples: Embedding, a Bidirectional LSTM returning
sequences, a Bidirectional GRU, a sigmoid output."""

import keras
import numpy as np

VOCAB = 300
MAXLEN = 12
BATCH_SIZE = 32
LOSS = "binary_crossentropy"
METRICS = ["accuracy"]


def build_model():
    inputs = keras.Input(shape=(None,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, 16)(inputs)
    x = keras.layers.Bidirectional(keras.layers.LSTM(8, return_sequences=True))(x)
    x = keras.layers.Bidirectional(keras.layers.GRU(8))(x)
    outputs = keras.layers.Dense(1, activation="sigmoid")(x)
    return keras.Model(inputs, outputs)


def train_data():
    rng = np.random.default_rng(4)
    x = rng.integers(1, VOCAB, size=(384, MAXLEN)).astype("int32")
    y = (np.mean(x < VOCAB // 2, axis=1) > 0.5).astype("float32")
    return x, y
