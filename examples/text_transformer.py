"""A small transformer encoder (MultiHeadAttention + LayerNormalization) for text classification.

Synthetic token sequences: class 1 when the sequence contains more "positive" than "negative"
marker tokens, which the model must find anywhere in the sequence (attention's job).

Tune it:  precision-tuner tune examples/text_transformer.py --space quick
"""

import keras
import numpy as np

BATCH_SIZE = 32
LOSS = "sparse_categorical_crossentropy"
METRICS = ["accuracy"]

VOCAB = 2000
SEQUENCE = 64
WIDTH = 64
HEADS = 4


def encoder_block(x, index):
    attention = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name=f"attention_{index}")
    x = keras.layers.LayerNormalization(name=f"norm_attention_{index}")(x + attention(x, x))
    hidden = keras.layers.Dense(WIDTH * 2, activation="gelu", name=f"ffn_in_{index}")(x)
    hidden = keras.layers.Dense(WIDTH, name=f"ffn_out_{index}")(hidden)
    return keras.layers.LayerNormalization(name=f"norm_ffn_{index}")(x + hidden)


def build_model():
    tokens = keras.Input(shape=(SEQUENCE,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, WIDTH, name="token_embedding")(tokens)
    positions = keras.layers.Embedding(SEQUENCE, WIDTH, name="position_embedding")(
        keras.ops.arange(SEQUENCE))
    x = x + positions
    for index in range(2):
        x = encoder_block(x, index)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(2, activation="softmax", name="label")(x)
    return keras.Model(tokens, outputs, name="text_transformer")


def train_data():
    rng = np.random.default_rng(0)
    count = BATCH_SIZE * 40
    tokens = rng.integers(10, VOCAB, size=(count, SEQUENCE))
    positive = rng.integers(0, 6, size=count)
    negative = rng.integers(0, 6, size=count)
    for row in range(count):
        slots = rng.choice(SEQUENCE, positive[row] + negative[row], replace=False)
        tokens[row, slots[:positive[row]]] = 1   # marker token "positive"
        tokens[row, slots[positive[row]:]] = 2   # marker token "negative"
    labels = (positive > negative).astype("int32")
    return tokens.astype("int32"), labels
