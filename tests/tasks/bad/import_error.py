"""Reads a data file at import time that is not there."""

import keras
import numpy as np

LOSS = "mse"
DATA = np.load("/nonexistent/precision-tuner/features.npy")


def build_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def train_data():
    return DATA[:, :4], DATA[:, 4:]
