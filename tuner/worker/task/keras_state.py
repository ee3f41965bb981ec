"""Keras's global state in a worker process, made fresh before each use of the task.

A worker runs one task's models one after another (trials, the task check, the diagnostics, a
measurement of ``precision-tuner bench``, a guarded training): each starts from the state a
fresh process has, whatever the previous one left (a global dtype policy, floatx, epsilon, the
session's layer names and graph), with its own seed, and the previous model collected before
this one is built and its memory measured.
"""

from __future__ import annotations

import gc


def reset_keras_state(seed: int) -> None:
    """Undo everything a previous trial may have left behind in this process."""
    import keras

    keras.backend.clear_session()
    keras.config.set_dtype_policy("float32")
    keras.config.set_floatx("float32")
    keras.config.set_epsilon(1e-7)
    keras.utils.set_random_seed(seed)
    gc.collect()
