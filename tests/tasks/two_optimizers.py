"""Two optimizers on two parts of one network (discriminative learning rates): a slow SGD for
the body, Adam for the head, one loss, in a train_step written the way the Keras guide writes a
custom one, each optimizer scaling the loss for its own gradients.

The features are raw, unnormalised readings around 20000 (float16 holds them), the body's first
layer starts with tiny weights, and the loss is summed over the batch (``reduction="sum"``). So
the body's first-layer kernel gradient (x times the upstream gradient, summed over 256 samples)
is about 1e6: beyond float16's largest value (65504) even at a loss scale of 1. Under float16
compute the body's loss scale collapses, while the head's works (its inputs are small
activations): the classic one-optimizer-fails case. float32 trains both.
"""

import keras
import numpy as np
import tensorflow as tf

BATCH_SIZE = 256


class TwoSpeedClassifier(keras.Model):
    def __init__(self):
        super().__init__()
        self.body = keras.Sequential([
            keras.layers.Dense(32, activation="relu",
                               kernel_initializer=keras.initializers.RandomNormal(stddev=1e-5)),
            keras.layers.Dense(32, activation="relu"),
        ], name="body")
        self.head = keras.layers.Dense(3, activation="softmax", name="head")

    def call(self, x, training=False):
        return self.head(self.body(x, training=training))

    def compile(self, body_optimizer, head_optimizer, **kwargs):
        super().compile(**kwargs)
        self.body_optimizer = body_optimizer
        self.head_optimizer = head_optimizer

    def train_step(self, data):
        x, y = data
        with tf.GradientTape(persistent=True) as tape:
            predictions = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=predictions)
            body_scaled = self.body_optimizer.scale_loss(loss)
            head_scaled = self.head_optimizer.scale_loss(loss)
        body, head = self.body.trainable_weights, self.head.trainable_weights
        self.body_optimizer.apply_gradients(zip(tape.gradient(body_scaled, body), body))
        self.head_optimizer.apply_gradients(zip(tape.gradient(head_scaled, head), head))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, predictions)
        return {metric.name: metric.result() for metric in self.metrics}


def build_model():
    return TwoSpeedClassifier()


def compile_model(model, wrap_optimizer):
    model.compile(body_optimizer=wrap_optimizer(keras.optimizers.SGD(1e-7)),
                  head_optimizer=wrap_optimizer(keras.optimizers.Adam(1e-3)),
                  loss=keras.losses.SparseCategoricalCrossentropy(reduction="sum"))


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(20000.0, 2000.0, size=(4096, 8)).astype("float32")
    y = (x[:, 0] > 20000).astype("int32") + (x[:, 1] > 22000).astype("int32")
    return x, y
