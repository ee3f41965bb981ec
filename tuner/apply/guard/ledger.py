"""What each training step leaves for the guard, written by the compiled step itself: the loss
tracker's running total and count, the losses a model's own ``train_step`` logs, and each
optimizer's applied updates and loss scale, one row a step in a ring of variables on the
training's device. The host reads the ring once every few steps (``StepLedger.read``: one call,
one synchronisation), so a healthy step costs the host no read of its own: Keras's
``LossScaleOptimizer`` skips a non-finite step inside the compiled step in the same way, with
no host read at all.

``StepLedger.install`` makes the model's ``train_step`` (Keras's, or a model's own) the same
step with the row written after it: ``fit`` compiles it as it compiles Keras's (XLA included),
and the training's numbers are untouched (the row only reads variables the step wrote). Not
under ``tf.distribute`` (each replica would write its own row): there the guard reads after
each step (``tuner.apply.guard.step_reads``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import keras

from tuner.apply.guard.scales import ScaleWatch
from tuner.apply.keras_internals import own_distribution_strategy
from tuner.apply.loss_scaling import scale_tensor

# Rows the ring holds: the most steps the guard lets pass between two reads.
CAPACITY = 64
# Losses of a model's own ``train_step`` (a GAN's ``d_loss``, ``g_loss``) kept a step.
OWN_LOSSES = 4
# The first two columns: the loss tracker's total and count after the step; where the model has
# no tracker, the loss its step logs and ``_LOGGED``, or NaN and ``_NO_LOSS``. Then OWN_LOSSES
# columns, then each optimizer's applied updates so far and its loss scale.
_LOGGED, _NO_LOSS = -1.0, -2.0
_OWN = 2


@dataclass(frozen=True)
class LedgerRow:
    """One step's readings as the step wrote them: the loss tracker's ``total`` and ``count``
    after it (None where it has none) or the ``logged`` loss, the losses its own
    ``train_step`` logged by name, and for each watched optimizer (in the ledger's order) the
    updates applied so far and the loss scale after the step (None: none)."""

    total: float | None
    count: float | None
    logged: float | None
    own: dict[str, float]
    iterations: tuple[int, ...]
    scales: tuple[float | None, ...]


@dataclass(frozen=True)
class StepRow:
    """One step as the guard judges it: its loss (None where the model reports none of its
    own, as a GAN's ``train_step``), the losses its own step logged by name (where it has no
    loss), and, where the step wrote them (tuner.apply.guard.ledger), each watched optimizer's
    applied updates so far and loss scale after it (empty: each watch reads its own).
    ``steps``: the steps it stands for (a host read after a call of several steps reads the
    last one's loss: ``steps_per_execution``); ``weight``: its share of the loss tracker's
    count (None: no tracker counted it)."""

    loss: float | None
    logged: dict[str, float]
    iterations: tuple[int, ...] = ()
    scales: tuple[float | None, ...] = ()
    steps: int = 1
    weight: float | None = None


class StepLedger:
    """The ring of the last ``CAPACITY`` steps' rows, and the step that writes it."""

    def __init__(self, model: keras.Model, watches: Sequence[ScaleWatch], tracker: Any) -> None:
        import tensorflow as tf

        self.model, self.watches, self.tracker = model, list(watches), tracker
        self.own_names: list[str] = []       # the logged losses' columns, named when traced
        columns = _OWN + OWN_LOSSES + 2 * len(self.watches)
        # float64: a tracker's total and an optimizer's count stay exact over days of steps.
        self._ring = tf.Variable(tf.zeros([CAPACITY, columns], tf.float64), trainable=False,
                                 name="precision_guard_ledger")
        self._written = tf.Variable(0, dtype=tf.int64, trainable=False,
                                    name="precision_guard_steps")
        self._read_fn = tf.function(lambda: (self._written.read_value(),
                                             self._ring.read_value()))
        self._seen = 0
        self._inner = None

    # -- the step ------------------------------------------------------------------------------
    def install(self) -> None:
        """Make the model's training step write its row (an attribute of this one model; the
        step it wraps may itself be one, a custom loop's: tuner.apply.own_step)."""
        model = self.model
        self._inner = vars(model).get("train_step")
        inner = model.train_step
        ledger = self

        def train_step(data):
            logs = inner(data)
            ledger._write(logs)
            return logs

        model.train_step = train_step

    def uninstall(self) -> None:
        """The model's own step back (and its train function made anew on its next fit)."""
        model = self.model
        if self._inner is not None:
            model.train_step = self._inner
        else:
            vars(model).pop("train_step", None)
        model.train_function = None

    def _write(self, logs: Any) -> None:
        """The row of the step just run (its reads come after the step's own writes: a
        function's stateful operations run in the order written)."""
        import tensorflow as tf

        def as64(value):
            return tf.cast(value, tf.float64)

        if self.tracker is not None:
            row = [as64(self.tracker.total.value), as64(self.tracker.count.value)]
        elif isinstance(logs, dict) and _scalar(logs.get("loss")):
            row = [as64(logs["loss"]), as64(_LOGGED)]
        else:
            row = [as64(float("nan")), as64(_NO_LOSS)]
        row += [as64(value) for value in self._own_losses(logs)]
        for watch in self.watches:
            optimizer = getattr(watch.optimizer, "inner_optimizer", watch.optimizer)
            row += [as64(optimizer.iterations.value), as64(scale_tensor(watch.optimizer))]
        # A scatter at an index computed in the step (XLA would compile a slice's begin in, as
        # a constant: a compilation a step).
        at = tf.reshape(tf.math.floormod(self._written.read_value(), CAPACITY), [1, 1])
        self._ring.scatter_nd_update(at, tf.expand_dims(tf.stack(row), 0))
        self._written.assign_add(1)

    def _own_losses(self, logs: Any) -> list:
        """The ``*loss`` scalars a model's own step logs, in columns named on the first trace."""
        values = {}
        if isinstance(logs, dict):
            values = {name: value for name, value in logs.items()
                      if str(name).endswith("loss") and _scalar(value)}
        for name in values:
            if name not in self.own_names and len(self.own_names) < OWN_LOSSES:
                self.own_names.append(name)
        return [values.get(name, 0.0) for name in self.own_names] + \
            [0.0] * (OWN_LOSSES - len(self.own_names))

    # -- the host ------------------------------------------------------------------------------
    def read(self) -> list[LedgerRow]:
        """The rows of the steps since the last read, oldest first (one host read); at most
        ``CAPACITY``: a step written over before it was read is not there."""
        written, ring = (value.numpy() for value in self._read_fn())
        first = max(self._seen, int(written) - CAPACITY)
        rows = [self._row(ring[step % CAPACITY]) for step in range(first, int(written))]
        self._seen = int(written)
        return rows

    def skip(self) -> None:
        """Forget the rows written so far (those of a repair's own probes of the step)."""
        self._seen = int(self._read_fn()[0].numpy())

    def _row(self, values) -> LedgerRow:
        first, second = float(values[0]), float(values[1])
        at = _OWN + OWN_LOSSES
        return LedgerRow(
            total=first if second >= 0 else None, count=second if second >= 0 else None,
            logged=first if second == _LOGGED else None,
            own={name: float(values[_OWN + index]) for index, name in enumerate(self.own_names)},
            iterations=tuple(int(values[at + 2 * i]) for i in range(len(self.watches))),
            scales=tuple(_finite_or_none(values[at + 2 * i + 1])
                         for i in range(len(self.watches))))


def usable(model: keras.Model) -> bool:
    """Can the step write its own row? Not under ``tf.distribute`` with several replicas (nor
    one given a strategy of its own), nor where the model runs eagerly (nothing compiled to
    save a read in)."""
    import tensorflow as tf

    return own_distribution_strategy(model) is None and not tf.distribute.has_strategy() \
        and not model.run_eagerly


def _finite_or_none(value: Any) -> float | None:
    return float(value) if math.isfinite(float(value)) else None


def _scalar(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    return shape is not None and len(shape) == 0 and dtype is not None \
        and "float" in str(dtype)
