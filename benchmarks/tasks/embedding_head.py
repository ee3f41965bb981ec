"""A small-step model of another kind than the examples, for ``benchmarks/guard_overhead.py``:
review tokens through a 20000 x 32 embedding, averaged, to a one-unit head (a step of about a
few milliseconds on a 2-core CPU, most of it the embedding's update).

    .venv/bin/python benchmarks/guard_overhead.py --task benchmarks/tasks/embedding_head.py
"""

import keras
import numpy as np

BATCH_SIZE = 64
LOSS = "binary_crossentropy"
VOCABULARY, LENGTH = 20000, 40


def train_data():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, VOCABULARY, size=(8192, LENGTH)).astype("int32")
    labels = (tokens % 7 == 0).mean(axis=1) > 1 / 7
    return tokens, labels.astype("float32")


def make_optimizer():
    return keras.optimizers.Adam(1e-3)


def build_model():
    return keras.Sequential([
        keras.Input((LENGTH,), dtype="int32"),
        keras.layers.Embedding(VOCABULARY, 32),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(1, activation="sigmoid", name="head"),
    ], name="embedding_head")
