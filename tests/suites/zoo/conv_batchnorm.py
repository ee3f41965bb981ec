"""A small convnet: Conv2D + BatchNormalization + ReLU blocks, pooling, softmax; metrics."""

import keras
import numpy as np

BATCH_SIZE = 32
LOSS = "sparse_categorical_crossentropy"
METRICS = ["accuracy"]


def conv_block(x, filters):
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    return keras.layers.ReLU()(x)


def build_model():
    inputs = keras.Input(shape=(12, 12, 1))
    x = conv_block(inputs, 8)
    x = keras.layers.MaxPooling2D()(x)
    x = conv_block(x, 16)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def train_data():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, size=384)
    x = rng.normal(scale=0.5, size=(384, 12, 12, 1)).astype("float32")
    x[y == 1, :6] += 1.0       # class 1: bright top half
    x[y == 2, :, :6] -= 1.0    # class 2: dark left half
    return x, y.astype("int32")
