"""The cause of a precision loss (``precision_loss``): ``smallest_float32_set`` finds the
smallest set of 16-bit layers whose float32 compute takes the model's output on the batch
most of the way back to float32's, by halving and elimination over the model's innermost layers
(weightless ones included: an ``Add`` rounds a stream too; then the layers that hold others, whose
own ``call`` may round, and the model's own input cast), as inference tools search for the layers to
fall back to higher precision. Every candidate set is tried on the batch, eagerly, and undone; at
most ``MAX_TRIES`` forward passes.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator

import keras
import numpy as np

from tuner.apply.config_data import ConfigData
from tuner.apply.guard import cause
from tuner.apply.guard.precision_loss import BatchLoss, BatchLosses, batch_loss
from tuner.apply.layers import layer_paths, sublayers

RESIDUAL = 0.1    # a set of float32 layers that leaves this share of the output's distance
                  # from float32's (mean squared) has brought the model back
MAX_TRIES = 160   # forward passes one search may take
SIXTEEN_BIT = ("float16", "bfloat16")


def candidates(model: keras.Model, config: ConfigData, innermost: bool = True) -> list[str]:
    """The layers computing in 16 bits, in the model's order, that the config does not already
    keep in float32: the innermost ones, or (``innermost=False``, where those alone do not
    bring the output back: a custom block adding ``h + z`` in its own ``call``) every layer,
    the innermost first, and the model itself (its call casts its inputs)."""
    layers = [(layer, path) for layer, path in layer_paths(model)
              if layer.compute_dtype in SIXTEEN_BIT and path not in config.float32.layers]
    inner = [path for layer, path in layers if not sublayers(layer)]
    if innermost:
        return inner
    outer = [path for layer, path in layers if sublayers(layer)]
    itself = [model.name] if model.compute_dtype in SIXTEEN_BIT else []   # its input casts
    return inner + outer + itself


@dataclass(frozen=True)
class FoundSet:
    """What the search found: the layers, the batch's loss before and with them in float32,
    and how many forward passes it took."""

    layers: tuple[str, ...]
    before: BatchLoss
    after: BatchLoss
    tries: int

    def describe(self) -> str:
        return (f"{len(self.layers)} of the model's 16-bit layers in float32 bring the kept "
                f"batch's loss from {self.before.gap:.3g}x float32's to {self.after.gap:.3g}x "
                f"({self.tries} forward passes)")


def smallest_float32_set(model: keras.Model, config: ConfigData, batch: Any) -> FoundSet | None:
    """The smallest set of 16-bit layers (1-minimal: none of them can be left out) whose
    float32 compute takes the model's output on the batch most of the way to float32's (the
    distance left at most ``RESIDUAL`` of the model's as it runs), with the batch's loss then;
    None where even all of them do not, or the batch has no loss to compare."""
    before = batch_loss(model, batch)
    if before is None:
        return None
    search = _Search(model, config, batch)
    innermost = candidates(model, config)
    pools = [innermost, candidates(model, config, innermost=False)]
    pool = next((pool for pool in pools if pool and search.restores(pool)), None)
    if pool is None:
        return None
    found = search.minimise(pool)
    with search.placed(found):
        as_is = BatchLosses(model, compiled=False)(batch)
    if as_is is None:   # the batch's loss, computed for ``before``, failed with the set placed
        return None
    after = BatchLoss(as_is, before.in_float32)
    return FoundSet(tuple(found), before, after, search.tries)


def _outputs(model: keras.Model, x: Any) -> np.ndarray:
    import tensorflow as tf

    flat = [np.asarray(t, dtype=np.float64).reshape(t.shape[0], -1)
            for t in tf.nest.flatten(model(x, training=False))
            if hasattr(t, "dtype") and t.dtype.is_floating and t.shape.rank]
    return np.concatenate(flat, axis=1) if flat else np.zeros((0, 0))


class _Search:
    """A search over layer sets, each tried by placing it in float32 on the batch and
    measuring how far the model's output then is from float32's."""

    def __init__(self, model: keras.Model, config: ConfigData, batch: Any) -> None:
        self.model, self.config = model, config
        self.x = keras.utils.unpack_x_y_sample_weight(batch)[0]
        with cause.computing_in_float32(model):
            self.reference = _outputs(model, self.x)
        self.start = self.distance()
        self.tries = 0

    def distance(self) -> float:
        with np.errstate(invalid="ignore", over="ignore"):
            value = float(np.mean(np.square(_outputs(self.model, self.x) - self.reference)))
        return value if math.isfinite(value) else math.inf

    @contextlib.contextmanager
    def placed(self, layers: list[str]) -> Iterator[None]:
        changed = [pair for path in layers
                   for pair in cause.place_in_float32(self.model, self.config, path)]
        try:
            yield
        finally:
            cause.undo(changed)

    def restores(self, layers: list[str]) -> bool:
        self.tries += 1
        with self.placed(layers):
            return self.distance() <= RESIDUAL * self.start
    def minimise(self, layers: list[str]) -> list[str]:
        """``layers`` restores the output; a 1-minimal subset that still does: halves first,
        while one half alone restores (a cause in one place takes a few tries), then each
        layer left out in turn and kept out where the rest still restores (one try a layer;
        several layers at fault all stay). The best found so far once ``MAX_TRIES`` is
        spent: every set kept on the way restores."""
        while len(layers) >= 2 and self.tries < MAX_TRIES:
            half = len(layers) // 2
            smaller = next((part for part in (layers[:half], layers[half:])
                            if self.restores(part)), None)
            if smaller is None:
                break
            layers = smaller
        for name in list(layers):
            if len(layers) == 1 or self.tries >= MAX_TRIES:
                break
            rest = [other for other in layers if other != name]
            if self.restores(rest):
                layers = rest
        return layers
