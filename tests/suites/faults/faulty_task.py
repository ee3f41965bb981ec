"""A task that misbehaves on purpose, chosen by the FAULT environment variable.

Most faults strike only under mixed_bfloat16, so that the float32 baseline trains and the
search has something to go on with: build (an exception in build_model), oom (a tensor far
too large for memory), segv (a hard crash of the worker process), hang (never returns).

remeasure_segv and remeasure_hang strike once a mixed_bfloat16 model has trained more steps
than the search's trial (``STRIKE_AFTER``): the re-measurement trains the finalist's live model
on from there. The strike leaves a file ``struck`` in FAULT_DIR, and builds are counted there too
(``builds-<policy>``), since the worker that counts may be replaced. oom_kill allocates memory until
the kernel's OOM killer ends the worker (run it in a memory-limited cgroup only). baseline_nan makes
the float32 baseline itself diverge: its loss turns NaN after 8 training steps (the task check's 3
diagnostic steps pass).
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


# Training-mode forward passes before the strike: more than the search trial's (the tests'
# --steps 12, plus the pass that counts its training memory), fewer than that plus the
# re-measurement's first run of the same live model (12 more).
STRIKE_AFTER = 20


def _strike(calls, armed=True):
    # Every step of both models sleeps alike, so that they time alike in the search: a counting
    # layer in the finalist alone made it clearly slower than float32 on some runs, and a
    # finalist clearly behind (or below float32 beyond a run's drift) is dropped before the
    # re-measurement (nothing to strike in). The sleep is long beside the step's compute, so
    # that the machine's load cannot put the two 15% apart.
    time.sleep(0.02)
    if armed and float(calls) > STRIKE_AFTER:
        (Path(os.environ["FAULT_DIR"]) / "struck").write_text(FAULT)
        if FAULT == "remeasure_segv":
            import ctypes
            ctypes.string_at(0)  # read address 0: SIGSEGV
        time.sleep(3600)         # remeasure_hang
    return calls


class StrikeAfter(keras.layers.Layer):
    """Passes its input through; strikes (``_strike``) once it trained over STRIKE_AFTER steps
    (when ``armed``: under mixed_bfloat16; float32's copy only counts and sleeps alike)."""

    def __init__(self, armed=True, **kwargs):
        super().__init__(**kwargs)
        self.armed = armed

    def build(self, input_shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                     name="calls", dtype="float32")

    def compute_output_shape(self, input_shape):
        return input_shape

    def call(self, x, training=None):
        import tensorflow as tf

        if training:
            self.calls.assign_add(1.0)
        seen = tf.py_function(lambda calls: _strike(calls, self.armed),
                              [tf.cast(self.calls, tf.float32)], Tout=tf.float32)
        seen.set_shape(())
        return x + keras.ops.cast(seen * 0.0, x.dtype)


def build_model():
    policy = keras.config.dtype_policy().name
    if policy == "mixed_bfloat16":
        if FAULT == "build":
            raise ValueError("injected fault: build_model failed")
        if FAULT == "oom":
            import tensorflow as tf

            tf.zeros((2**22, 2**22))  # 64 TiB: no machine has it
        if FAULT.startswith("remeasure_"):
            _builds_so_far(policy)
        if FAULT == "segv":
            import ctypes

            ctypes.string_at(0)  # read address 0: SIGSEGV
        if FAULT == "hang":
            time.sleep(3600)
        if FAULT == "oom_kill":  # real pages, 256 MiB at a time, until the kernel says no
            hoard = []
            while True:
                hoard.append(np.ones(2**25))
    inputs = keras.Input((4,))
    x = keras.layers.Dense(8, activation="relu")(inputs)
    if FAULT.startswith("remeasure_"):
        x = StrikeAfter(armed=policy == "mixed_bfloat16", name="strike")(x)
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
