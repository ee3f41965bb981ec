"""Precision loss: a training that stays finite and still learns less because its 16-bit compute
rounds away what the model needs (a head whose outputs sit far from zero, ~290 K where
bfloat16's step is 2; a residual stream carrying an offset of 1000, where bfloat16's step of 8
rounds every block's correction away). No layer is off by half its size and nothing is NaN; the
model's loss on a batch, as it runs, against the same weights computed in float32, shows it.

``batch_loss`` computes that pair on the guard's kept batch: two inference-mode forward passes
and the model's own compiled loss (its metrics left as they were). ``LossGapWatch`` counts a
gap beyond ``GAP`` either way round at two checks running as a failure (one check can be a
batch's luck). Either way: a model trained under lossy compute learns weights that only work
rounded (the offset stream's loss in float32 is 4-7x its loss as it runs); on healthy
trainings (digits, a transformer, a CNN, house prices; float16 and bfloat16) the gap measured
0.996-1.01x.

Its cause is found by ``float32_set``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator

import keras

from tuner.apply.guard import cause
from tuner.apply.guard.watch import InARow
from tuner.apply.layers import layer_paths

GAP = 1.25        # the batch's loss as it runs, over float32's, that counts as a loss


@dataclass(frozen=True)
class BatchLoss:
    """The model's loss on one batch as it runs, and with every layer in float32."""

    as_is: float
    in_float32: float

    @property
    def gap(self) -> float:
        """How many times float32's loss the model's is (1.0: no loss to precision)."""
        if not math.isfinite(self.as_is):
            return math.inf
        if self.in_float32 <= 0:
            return 1.0 if self.as_is <= 0 else math.inf
        return self.as_is / self.in_float32

    @property
    def apart(self) -> float:
        """The gap either way round: 4.0 for a loss 4x float32's and for one a quarter of it."""
        gap = self.gap
        if gap <= 0:
            return math.inf
        return max(gap, 1 / gap)

    def describe(self) -> str:
        return (f"the kept batch's loss is {self.as_is:.4g} as the model runs and "
                f"{self.in_float32:.4g} with every layer in float32 ({self.gap:.3g}x)")


def batch_loss(model: keras.Model, batch: Any, losses: "BatchLosses | None" = None
               ) -> BatchLoss | None:
    """The pair on ``batch``; None where the model has no compiled loss to compute (a
    ``train_step`` with a loss of its own), the batch no targets, or float32's loss is not
    finite (no precision question there). ``losses``: compiled forward passes to reuse."""
    losses = losses or BatchLosses(model, compiled=False)
    as_is = losses(batch)
    if as_is is None:
        return None
    with cause.computing_in_float32(model):
        in_float32 = losses(batch)
    if in_float32 is None or not math.isfinite(in_float32):
        return None
    return BatchLoss(as_is, in_float32)


class BatchLosses:
    """The model's compiled loss on a batch in inference mode, as its layers' dtype policies
    are when called. ``compiled``: each set of policies gets its own traced function, kept (a
    check then costs two graph calls, not two eager passes through every layer's Python); a
    model that does not trace is run eagerly."""

    def __init__(self, model: keras.Model, compiled: bool = True) -> None:
        self.model, self.compiled = model, compiled
        self._functions: dict[tuple, Any] = {}

    def __call__(self, batch: Any) -> float | None:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        with _metrics_kept(self.model):
            try:
                loss = self._function()(x, y, sample_weight)
            except Exception:  # noqa: BLE001 - no compiled loss, or none for this batch
                if not self.compiled:
                    return None
                self.compiled = False   # a model that does not trace: eagerly from now on
                return self(batch)
        # a loss added in the layer's 16-bit dtype (add_loss) comes back in it
        return float(keras.ops.convert_to_numpy(keras.ops.cast(loss, "float32")))

    def _function(self):
        if not self.compiled:
            return self._loss
        import tensorflow as tf

        key = tuple(layer.dtype_policy.name for layer in
                    [self.model] + [layer for layer, _ in layer_paths(self.model)])
        if key not in self._functions:
            if len(self._functions) >= 4:   # the policies before a repair are not coming back
                self._functions.clear()
            self._functions[key] = tf.function(self._loss, reduce_retracing=True)
        return self._functions[key]

    def _loss(self, x, y, sample_weight):
        prediction = self.model(x, training=False)
        return self.model.compute_loss(x=x, y=y, y_pred=prediction,
                                       sample_weight=sample_weight, training=False)


@contextlib.contextmanager
def _metrics_kept(model: keras.Model) -> Iterator[None]:
    """Keras's compiled loss updates per-output loss metrics as it computes: put them back, so
    that the training's logs do not see the guard's batch."""
    variables = [variable for metric in model.metrics for variable in metric.variables]
    values = [variable.numpy() for variable in variables]
    try:
        yield
    finally:
        for variable, value in zip(variables, values):
            variable.assign(value)


class LossGapWatch:
    """The detector: the kept batch's loss as the model runs, against float32's on the same
    weights, beyond ``GAP`` either way round at two checks running (``judge``)."""

    def __init__(self) -> None:
        self._running = InARow(2)   # checks in a row beyond the gap
        self._losses: BatchLosses | None = None

    def check(self, model: keras.Model, batch: Any) -> str | None:
        """What it saw, where this check makes a failure; None otherwise."""
        if self._losses is None or self._losses.model is not model:
            self._losses = BatchLosses(model)
        return self.judge(batch_loss(model, batch, self._losses))

    def judge(self, found: BatchLoss | None) -> str | None:
        """One check's pair (None: nothing to compare): what it saw where it is the second
        running beyond the gap."""
        apart = found is not None and found.apart > GAP
        if not self._running.seen(["model"] if apart else []):
            return None
        assert found is not None   # seen() names the model only after a check beyond the gap
        return f"{found.describe()}, two checks running (allowed {GAP:g}x either way)"


class Float32CheckWatch:
    """The detector on ``float32_check=``'s data: its loss as the model runs and with every
    layer in float32, beyond ``GAP`` either way round two epochs running."""

    def __init__(self) -> None:
        self.run = 0    # epochs in a row beyond the gap

    def judge(self, as_is: float, in_float32: float) -> str | None:
        if not (math.isfinite(in_float32) and in_float32 > 0):
            self.run = 0
            return None
        apart = BatchLoss(as_is, in_float32).apart
        self.run = self.run + 1 if apart > GAP else 0
        if self.run < 2:
            return None
        self.run = 0
        return (f"the float32 check's loss is {as_is:.4g} as the model runs and "
                f"{in_float32:.4g} with every layer in float32 ({apart:.3g}x apart, two epochs "
                f"running; allowed {GAP:g}x)")
