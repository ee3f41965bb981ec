"""Every training step sleeps 80 ms inside the graph, so a trial lasts a few seconds:
long enough for fault-injection tests to kill its worker mid-trial."""

import time

import keras
import numpy as np
import tensorflow as tf

BATCH_SIZE = 32
LOSS = "mse"


class Sleep(keras.layers.Layer):
    def call(self, x):
        def pause(value):
            time.sleep(0.08)
            return value

        slept = tf.py_function(pause, [x], Tout=x.dtype)
        slept.set_shape(x.shape)
        return slept


def build_model():
    inputs = keras.Input((4,))
    x = Sleep(name="sleep")(keras.layers.Dense(8)(inputs))
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 4)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) > 0).astype("float32")
