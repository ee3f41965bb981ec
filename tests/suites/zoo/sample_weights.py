"""A subclassed model whose train_step takes sample weights: ``x, y, sample_weight = data``."""

import keras
import numpy as np
import tensorflow as tf

LOSS = keras.losses.SparseCategoricalCrossentropy()
BATCH_SIZE = 32


class WeightedClassifier(keras.Model):
    def __init__(self, num_classes=3, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.dropout = keras.layers.Dropout(0.1)
        self.classifier = keras.layers.Dense(num_classes, activation="softmax")
        self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, inputs, training=False):
        return self.classifier(self.dropout(self.hidden(inputs), training=training))

    @property
    def metrics(self):
        return [self.loss_tracker, self.accuracy]

    def train_step(self, data):
        x, y, sample_weight = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.accuracy.update_state(y, y_pred, sample_weight=sample_weight)
        return {"loss": self.loss_tracker.result(), "accuracy": self.accuracy.result()}


def build_model():
    return WeightedClassifier()


def make_optimizer():
    return keras.optimizers.Adam(3e-3)


def train_data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(640, 16)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0.5).astype("int32")
    sample_weight = np.where(y == 2, 2.0, 1.0).astype("float32")  # the rare class counts double
    return x, y, sample_weight
