"""A functional encoder model reused inside another functional model (a siamese pair): nested
models, shared weights, a Softmax layer inside the encoder."""

import keras
import numpy as np

BATCH_SIZE = 32
LOSS = "binary_crossentropy"
METRICS = ["accuracy"]


def make_encoder():
    inputs = keras.Input(shape=(16,))
    x = keras.layers.Dense(16, activation="relu")(inputs)
    x = keras.layers.Dense(8)(x)
    attention = keras.layers.Softmax()(x)
    outputs = keras.layers.Multiply()([x, attention])
    return keras.Model(inputs, outputs, name="encoder")


def build_model():
    encoder = make_encoder()
    left = keras.Input(shape=(16,), name="left")
    right = keras.Input(shape=(16,), name="right")
    difference = keras.layers.Subtract()([encoder(left), encoder(right)])
    x = keras.layers.Lambda(keras.ops.abs)(difference)
    outputs = keras.layers.Dense(1, activation="sigmoid")(x)
    return keras.Model([left, right], outputs)


def train_data():
    rng = np.random.default_rng(8)
    left = rng.normal(size=(384, 16)).astype("float32")
    same = rng.random(384) < 0.5
    right = np.where(same[:, None], left + 0.1 * rng.normal(size=(384, 16)),
                     rng.normal(size=(384, 16))).astype("float32")
    return (left, right), same.astype("float32")
