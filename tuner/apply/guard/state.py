"""What the guard keeps to repair a training: a snapshot of the model's variables and the
optimizer's (loss scale and step counters included) in host memory, and the last training
batch, kept on the device by the ``train_step`` so that a failure can be diagnosed on the
batch it happened on.

The snapshot costs host memory equal to the model's variables plus the optimizer's: for Adam,
about three times the float32 weights (the weights and two moments), 12 bytes a parameter.
Reading variables never changes them, so a healthy training is untouched.

The batch is kept in non-trainable ``tf.Variable`` s that the wrapped ``train_step`` assigns
before it runs the user's: one extra copy of the batch on the device, and the same computation
otherwise. XLA-compiled steps (``jit_compile=True``) cannot assign a variable whose shape
changes, so there the guard keeps no batch and diagnoses on ``data=`` if it was given one.
"""

from __future__ import annotations

import functools
from typing import Any

import keras
import numpy as np


class Snapshot:
    """Host copies of every model and optimizer variable, taken at one step."""

    def __init__(self, model: keras.Model, step: int) -> None:
        self.step = step
        self._variables = _state_variables(model)
        self._values = [np.array(keras.ops.convert_to_numpy(v)) for v in self._variables]

    @property
    def nbytes(self) -> int:
        return sum(value.nbytes for value in self._values)

    def restore(self, model: keras.Model) -> None:
        for variable, value in zip(_state_variables(model), self._values):
            variable.assign(value)


def _state_variables(model: keras.Model) -> list:
    optimizer = getattr(model, "optimizer", None)
    extra = list(optimizer.variables) if optimizer is not None and optimizer.built else []
    return list(model.variables) + extra


class BatchKeeper:
    """Keeps the last batch ``train_step`` received, by wrapping it (an instance attribute, as
    the float32 placements wrap ``call``); ``unwrap`` takes the wrapper off again."""

    def __init__(self) -> None:
        self._slots: list = []
        self._filled = None
        self._structure: Any = None
        self._model: keras.Model | None = None

    def wrap(self, model: keras.Model) -> bool:
        """Wrap ``model.train_step``; False where no batch can be kept (XLA, or already
        wrapped by another guard)."""
        if model.jit_compile or getattr(model.train_step, "_precision_guard", False):
            return False
        keras_step = model.train_step
        keeper = self

        @functools.wraps(keras_step)
        def train_step(data):
            keeper._keep(data)
            return keras_step(data)

        train_step._precision_guard = True
        object.__setattr__(model, "train_step", train_step)
        self._model = model
        return True

    def unwrap(self) -> None:
        if self._model is not None and "train_step" in vars(self._model):
            object.__delattr__(self._model, "train_step")
            self._model.train_function = None  # the next fit traces the user's own step
        self._model = None

    def _keep(self, data) -> None:
        import tensorflow as tf

        leaves = tf.nest.flatten(data)
        if not all(isinstance(leaf, tf.Tensor) for leaf in leaves):
            return  # ragged or sparse parts: no batch to keep
        if not self._slots:
            with tf.init_scope():  # created once, outside the traced function
                self._slots = [tf.Variable(tf.zeros([0] * leaf.shape.rank, leaf.dtype),
                                           shape=tf.TensorShape(None), trainable=False)
                               for leaf in leaves]
                self._filled = tf.Variable(False, trainable=False)
            self._structure = data
        if len(self._slots) == len(leaves):
            for slot, leaf in zip(self._slots, leaves):
                slot.assign(leaf)
            self._filled.assign(True)

    def batch(self) -> Any | None:
        """The last batch as tensors in its own structure, or None before the first step."""
        import tensorflow as tf

        if not self._slots or not bool(self._filled.numpy()):
            return None
        return tf.nest.pack_sequence_as(self._structure,
                                        [tf.identity(slot) for slot in self._slots])
