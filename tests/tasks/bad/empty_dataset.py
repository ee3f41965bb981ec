"""A filter that keeps nothing: the dataset is empty."""

import keras
import numpy as np
import tensorflow as tf

LOSS = "mse"


def build_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def train_data():
    x = np.random.default_rng(0).normal(size=(320, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    return dataset.filter(lambda features, target: target[0] > 1e6).batch(32)
