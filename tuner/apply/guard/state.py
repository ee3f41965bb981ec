"""What the guard keeps to repair a training: a snapshot of the model's variables and the
optimizer's (loss scale and step counters included) in host memory, and the last training
batch, so that a failure can be diagnosed on the batch it happened on.

The snapshot costs host memory equal to the model's variables plus the optimizer's: for Adam,
about three times the float32 weights (the weights and two moments), 12 bytes a parameter.
Reading variables never changes them, so a healthy training is untouched. A snapshot is only
kept when its values are finite (``Snapshot.finite``): restoring must never bring a broken
state back.

The batch is kept by wrapping ``model.train_function``, outside the compiled step: the wrapper
takes the next batch from the iterator ``fit`` hands it, keeps a reference to it (no copy), and
passes it to Keras's own step function, compiled as Keras compiled it. So it works the same with
and without XLA (``jit_compile=True``, Keras's default wherever a GPU is visible) and the
computation is unchanged. Under ``tf.distribute`` the element it takes holds one share per
replica: each replica trains on its own, and the batch kept for a diagnosis is the shares put
back together (``_whole_batch``).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from tuner.apply.instruments import HostCopy
from tuner.apply.loss_scaling import held_optimizers

# Marks the train function a guard wrapped, so that no guard wraps it twice and ``unwrap`` knows
# it. An attribute of a plain function, which mypy does not type: set and read by name.
_GUARDED = "_precision_guard"


class Snapshot:
    """Host copies of every model and optimizer variable, taken at one step
    (``tuner.apply.instruments.HostCopy``)."""

    def __init__(self, model: keras.Model, step: int) -> None:
        self.step = step
        self.position = step   # steps the weights hold (the training sets it: restores rewind)
        held = held_optimizers(model)
        # Where the model holds optimizers of its own (a GAN's), compile's default
        # ``optimizer`` is one its train_step never applies: it is never built.
        self.complete = all(optimizer.built for name, optimizer in held.items()
                            if not (name == "optimizer" and len(held) > 1))
        self._copy = HostCopy(_state_variables(model))

    @property
    def finite(self) -> bool:
        """Every float value finite: only such a snapshot is worth restoring."""
        return self._copy.finite

    @property
    def nbytes(self) -> int:
        return self._copy.nbytes

    def restore(self, model: keras.Model) -> None:
        self._copy.put_back(_state_variables(model))

    def holds(self, model: keras.Model) -> bool:
        """Is the model's state still this snapshot's (nothing to restore)?"""
        now = HostCopy(_state_variables(model)).values
        return len(now) == len(self._copy.values) and all(
            np.array_equal(a, b, equal_nan=np.issubdtype(a.dtype, np.floating))
            for a, b in zip(now, self._copy.values))


def _state_variables(model: keras.Model) -> list:
    """The model's variables and every optimizer's it holds (a GAN's two), each once."""
    variables, seen = list(model.variables), {id(v) for v in model.variables}
    for optimizer in held_optimizers(model).values():
        if optimizer.built:
            for variable in optimizer.variables:
                if id(variable) not in seen:
                    seen.add(id(variable))
                    variables.append(variable)
    return variables


class BatchKeeper:
    """Keeps the last batch a training step received, by wrapping ``model.train_function``
    (an attribute ``fit`` reads before every step); ``unwrap`` puts Keras's function back."""

    def __init__(self) -> None:
        self._batch: Any = None
        self._joined: Any = None
        self._model: keras.Model | None = None
        self._keras_function = None

    def wrap(self, model: keras.Model) -> bool:
        """Wrap the model's current train function (call again after it is made anew); False
        where it is already a guard's."""
        import tensorflow as tf

        keras_function = model.train_function
        if keras_function is None or getattr(keras_function, _GUARDED, False):
            return False
        keeper = self
        # Keras's compiled step, called with a list of the batches taken here (a train
        # function takes one as well as an iterator: tuner.apply.keras_internals).

        def train_function(iterator):
            if not isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                return keras_function(iterator)
            batches = []
            for _ in range(max(1, int(model.steps_per_execution))):
                try:
                    batches.append(iterator.get_next())
                except tf.errors.OutOfRangeError:
                    break
            if not batches:
                raise StopIteration  # the end of the data, as fit expects it
            keeper._batch, keeper._joined = batches[-1], None   # a reference, joined if asked
            # Keras runs its compiled step on each element (under a strategy, each replica on
            # its own share of the distributed element).
            return keras_function(batches)

        setattr(train_function, _GUARDED, True)
        model.train_function = train_function
        self._model, self._keras_function = model, keras_function
        return True

    def rewrap(self) -> None:
        """After ``model.make_train_function(force=True)``: wrap the new function."""
        if self._model is not None:
            self.wrap(self._model)

    def unwrap(self) -> None:
        model = self._model
        if model is not None and getattr(model.train_function, _GUARDED, False):
            model.train_function = self._keras_function
        self._model = self._keras_function = None

    def keep(self, model: keras.Model, batch: Any) -> None:
        """Keep ``batch``, by reference: a loop that is not ``fit`` hands each batch over itself
        (tuner.apply.guard.loop)."""
        self._model, self._batch, self._joined = model, batch, None

    def batch(self) -> Any | None:
        """The last batch in its own structure, or None before the first step (under a
        strategy its replicas' shares put back together, once per batch, when first asked)."""
        if self._batch is not None and self._joined is None:
            self._joined = _whole_batch(self._model, self._batch)
        return self._joined


def _whole_batch(model: keras.Model, element: Any) -> Any:
    """The batch as the step saw it in all: under ``tf.distribute`` a distributed element holds
    one share per replica, put back together here (the diagnosis then runs on every sample the
    step ran on, outside any replica, its variables read from the first device); elsewhere the
    element itself."""
    import tensorflow as tf

    if not any(isinstance(t, tf.distribute.DistributedValues) for t in tf.nest.flatten(element)):
        return element
    local = model.distribute_strategy.experimental_local_results

    def joined(value):
        if not isinstance(value, tf.distribute.DistributedValues):
            return value
        shares = [tf.identity(share) for share in local(value)]
        return shares[0] if len(shares) == 1 else tf.concat(shares, axis=0)

    return tf.nest.map_structure(joined, element)
