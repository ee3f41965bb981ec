"""Keras's "customizing what happens in fit()" guide: a Model subclass built with the functional
API, whose own train_step unpacks ``x, y = data`` and updates the metrics itself."""

import keras
import numpy as np
import tensorflow as tf

LOSS = "mse"
METRICS = ["mae"]
BATCH_SIZE = 32


class CustomModel(keras.Model):
    def train_step(self, data):
        x, y = data

        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)

        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)

        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def build_model():
    inputs = keras.Input(shape=(32,))
    x = keras.layers.Dense(32, activation="relu")(inputs)
    outputs = keras.layers.Dense(1)(x)
    return CustomModel(inputs, outputs)


def make_optimizer():
    return keras.optimizers.Adam(1e-2)


def train_data():
    rng = np.random.default_rng(0)
    x = rng.random((512, 32)).astype("float32")
    y = x[:, :4].sum(axis=1, keepdims=True) - 2.0
    return x, y
