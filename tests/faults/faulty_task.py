"""A task that misbehaves on purpose, chosen by the FAULT environment variable.

Most faults strike only under mixed_bfloat16, so that the float32 baseline trains and the
search has something to go on with: build (an exception in build_model), oom (a tensor far
too large for memory), segv (a hard crash of the worker process), hang (never returns).

remeasure_segv and remeasure_hang strike on the *second* mixed_bfloat16 build: the first is
the search's trial, the second the re-measurement's first run of that finalist (its model is
built again there). Builds are counted in a file in FAULT_DIR, since the worker that counts
may be replaced. oom_kill allocates memory until the kernel's OOM killer ends the worker (run
it in a memory-limited cgroup only). baseline_nan makes the float32 baseline itself diverge: its loss turns NaN
after 8 training steps (the task check's 3 diagnostic steps pass).
"""

import os
import time
from pathlib import Path

import keras
import numpy as np

LOSS = "mse"
BATCH_SIZE = 32
FAULT = os.environ.get("FAULT", "none")


def _builds_so_far(policy: str) -> int:
    """This build's ordinal among all builds under ``policy`` in this test (1, 2, ...)."""
    path = Path(os.environ["FAULT_DIR"]) / f"builds-{policy}"
    with open(path, "a") as handle:
        handle.write("x")
    return path.stat().st_size


class NanAfter(keras.layers.Layer):
    """Passes its input through, times NaN once it has trained more than `steps` steps."""

    def __init__(self, steps, **kwargs):
        super().__init__(**kwargs)
        self.steps = steps

    def build(self, input_shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                     name="calls")

    def call(self, x, training=None):
        if training:
            self.calls.assign_add(1.0)
        poison = keras.ops.where(self.calls > self.steps, float("nan"), 1.0)
        return x * keras.ops.cast(poison, x.dtype)


def build_model():
    policy = keras.config.dtype_policy().name
    if policy == "mixed_bfloat16":
        if FAULT == "build":
            raise ValueError("injected fault: build_model failed")
        if FAULT == "oom":
            import tensorflow as tf

            tf.zeros((2**22, 2**22))  # 64 TiB: no machine has it
        if FAULT == "segv" or (FAULT == "remeasure_segv" and _builds_so_far(policy) == 2):
            import ctypes

            ctypes.string_at(0)  # read address 0: SIGSEGV
        if FAULT == "hang" or (FAULT == "remeasure_hang" and _builds_so_far(policy) == 2):
            time.sleep(3600)
        if FAULT == "oom_kill":  # real pages, 256 MiB at a time, until the kernel says no
            hoard = []
            while True:
                hoard.append(np.ones(2**25))
    inputs = keras.Input((4,))
    x = keras.layers.Dense(8, activation="relu")(inputs)
    if FAULT == "baseline_nan":
        x = NanAfter(8)(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    if FAULT == "nan_data":
        x[5, 2] = np.nan
    return x, y
