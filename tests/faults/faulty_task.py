"""A task that misbehaves on purpose, chosen by the FAULT environment variable.

The fault strikes only under mixed_bfloat16, so that the float32 baseline trains and the
search has something to go on with: build (an exception in build_model), oom (a tensor far
too large for memory), segv (a hard crash of the worker process), hang (never returns).
"""

import os
import time

import keras
import numpy as np

LOSS = "mse"
BATCH_SIZE = 32
FAULT = os.environ.get("FAULT", "none")


def build_model():
    if keras.config.dtype_policy().name == "mixed_bfloat16":
        if FAULT == "build":
            raise ValueError("injected fault: build_model failed")
        if FAULT == "oom":
            import tensorflow as tf

            tf.zeros((2**22, 2**22))  # 64 TiB: no machine has it
        if FAULT == "segv":
            import ctypes

            ctypes.string_at(0)  # read address 0: SIGSEGV
        if FAULT == "hang":
            time.sleep(3600)
    inputs = keras.Input((4,))
    x = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    if FAULT == "nan_data":
        x[5, 2] = np.nan
    return x, y
