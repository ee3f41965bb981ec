"""Keras's functional-API guide, shrunk: two named inputs, two named outputs, dict data, one loss
per output (LOSS is a dict) and metrics per output."""

import keras
import numpy as np
import tensorflow as tf

NUM_WORDS = 200
NUM_TAGS = 6
NUM_DEPARTMENTS = 3
BATCH_SIZE = 32

LOSS = {
    "priority": keras.losses.BinaryCrossentropy(from_logits=True),
    "department": keras.losses.CategoricalCrossentropy(from_logits=True),
}
METRICS = {"department": ["accuracy"]}


def build_model():
    title_input = keras.Input(shape=(None,), name="title")
    tags_input = keras.Input(shape=(NUM_TAGS,), name="tags")
    title_features = keras.layers.Embedding(NUM_WORDS, 16)(title_input)
    title_features = keras.layers.GlobalAveragePooling1D()(title_features)
    x = keras.layers.concatenate([title_features, tags_input])
    x = keras.layers.Dense(16, activation="relu")(x)
    priority = keras.layers.Dense(1, name="priority")(x)
    department = keras.layers.Dense(NUM_DEPARTMENTS, name="department")(x)
    return keras.Model(inputs={"title": title_input, "tags": tags_input},
                       outputs={"priority": priority, "department": department})


def make_optimizer():
    return keras.optimizers.RMSprop(1e-2)


def train_data():
    rng = np.random.default_rng(2)
    samples = 512
    title = rng.integers(0, NUM_WORDS, size=(samples, 10))
    tags = rng.integers(0, 2, size=(samples, NUM_TAGS)).astype("float32")
    priority = (tags[:, 0] > 0).astype("float32")[:, None]
    department = keras.utils.to_categorical((title[:, 0] * NUM_DEPARTMENTS) // NUM_WORDS,
                                            NUM_DEPARTMENTS)
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"title": title, "tags": tags}, {"priority": priority, "department": department}))
    return dataset.shuffle(samples, seed=0).batch(BATCH_SIZE)
