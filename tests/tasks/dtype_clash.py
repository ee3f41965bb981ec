"""A custom layer that hard-codes a float32 constant: breaks under 16-bit compute."""

import keras
import numpy as np
import tensorflow as tf

LOSS = "mse"


class BiasShift(keras.layers.Layer):
    def call(self, x):
        return tf.add(x, tf.constant(0.5, dtype=tf.float32))  # raw TF op: no dtype promotion


def build_model():
    inputs = keras.Input(shape=(4,))
    x = keras.layers.Dense(8)(inputs)
    x = BiasShift(name="bias_shift")(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def train_data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(256, 4)).astype("float32"), rng.normal(size=(256, 1)).astype("float32")
