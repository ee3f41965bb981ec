"""A subclassed model with its own train_step and a tf.data pipeline."""

import keras
import numpy as np
import tensorflow as tf

LOSS = "sparse_categorical_crossentropy"


class Classifier(keras.Model):
    def __init__(self):
        super().__init__(name="classifier")
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.norm = keras.layers.BatchNormalization()
        self.head = keras.layers.Dense(3, activation="softmax")

    def call(self, x, training=False):
        return self.head(self.norm(self.hidden(x), training=training))

    def train_step(self, data):
        x, y = data[0], data[1]
        with tf.GradientTape() as tape:
            predictions = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=predictions)
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        return {"loss": loss}


def build_model():
    return Classifier()


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(640, 16)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
