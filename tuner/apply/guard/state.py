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
computation is unchanged. The batches of the steps the guard has not read yet are kept too (by
reference, at most ``WINDOW_BYTES`` of them): a failure found in a window of steps is diagnosed
on the batch of the step it happened on. After each call of the step the wrapper tells the guard
(``after``) how many steps ran; that is how the guard hears of ``fit``'s steps.

Under ``tf.distribute`` the element it takes holds one share per replica: each replica trains
on its own, and the batch kept for a diagnosis is the shares put back together
(``_whole_batch``).
"""

from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np

from tuner.apply.instruments import HostCopy
from tuner.apply.loss_scaling import held_optimizers

# The most bytes of batches the keeper holds for the steps the guard has not read yet.
WINDOW_BYTES = 256 * 2**20

# Marks the train function a guard wrapped, so that no guard wraps it twice and ``unwrap`` knows
# it. An attribute of a plain function, which mypy does not type: set and read by name.
_GUARDED = "_precision_guard"


class Snapshot:
    """Host copies of every model and optimizer variable, taken at one step
    (``tuner.apply.instruments.HostCopy``)."""

    def __init__(self, model: keras.Model, step: int, reader: StateReader | None = None) -> None:
        self.step = step
        self.position = step   # steps the weights hold (the training sets it: restores rewind)
        held = held_optimizers(model)
        # Where the model holds optimizers of its own (a GAN's), compile's default
        # ``optimizer`` is one its train_step never applies: it is never built.
        self.complete = all(optimizer.built for name, optimizer in held.items()
                            if not (name == "optimizer" and len(held) > 1))
        variables = _state_variables(model)
        self._copy = HostCopy(variables) if reader is None else reader.copy(variables)

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


class StateReader:
    """Host copies of many variables in one call of a compiled function (one synchronisation,
    not one a variable: a snapshot of a small model costs a quarter of the reads one by one).
    Made again where the variables change (an optimizer built by the training's first step)."""

    def __init__(self) -> None:
        self._for: tuple[int, ...] | None = None
        self._function = None

    def copy(self, variables: list) -> HostCopy:
        import tensorflow as tf

        key = tuple(id(variable) for variable in variables)
        if key != self._for:
            self._function = tf.function(lambda: [tf.identity(_value(variable))
                                                  for variable in variables])
            self._for = key
        assert self._function is not None
        return HostCopy.of_values([np.array(value) for value in self._function()])


def _value(variable: Any) -> Any:
    """A Keras variable's TensorFlow value (a TensorFlow variable's own)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


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
        self._window: list = []     # the batches of the steps not read yet, oldest first
        self._after: Callable[[Any, int], None] | None = None

    def wrap(self, model: keras.Model,
             after: Callable[[Any, int], None] | None = None) -> bool:
        """Wrap the model's current train function (call again after it is made anew); False
        where it is already a guard's. ``after(logs, steps)``: called after each call of it."""
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
            keeper._window.extend(batches)
            # Keras runs its compiled step on each element (under a strategy, each replica on
            # its own share of the distributed element).
            logs = keras_function(batches)
            if keeper._after is not None:
                keeper._after(logs, len(batches))
            return logs

        setattr(train_function, _GUARDED, True)
        model.train_function = train_function
        self._model, self._keras_function = model, keras_function
        if after is not None:
            self._after = after
        return True

    def rewrap(self) -> None:
        """After ``model.make_train_function(force=True)``: wrap the new function."""
        if self._model is not None:
            self.wrap(self._model)

    def take_window(self, steps: int) -> list:
        """The batches of the last ``steps`` steps, oldest first (None for a step whose batch
        was not kept), and the window emptied."""
        window, self._window = self._window[-steps:], []
        return [None] * (steps - len(window)) + window

    def window_steps(self) -> int | None:
        """How many batches like the last one ``WINDOW_BYTES`` holds (None before the first)."""
        if self._batch is None:
            return None
        return max(1, WINDOW_BYTES // max(1, _nbytes(self._batch)))

    def point_at(self, batch: Any) -> None:
        """Make ``batch`` the kept one (the batch of the step a window's row is read for)."""
        if batch is not None:
            self._batch, self._joined = batch, None

    def unwrap(self) -> None:
        model = self._model
        if model is not None and getattr(model.train_function, _GUARDED, False):
            model.train_function = self._keras_function
        self._model = self._keras_function = self._after = None
        self._window = []

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


def _nbytes(batch: Any) -> int:
    import tensorflow as tf

    return sum(int(getattr(t, "shape", tf.TensorShape([])).num_elements() or 0)
               * getattr(getattr(t, "dtype", None), "size", 0)
               for t in tf.nest.flatten(batch) if hasattr(t, "dtype"))


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
