"""Targets the model must learn to output, beyond what a 16-bit output layer can produce.

A regression whose targets stay in physical units (house prices in dollars, up to ~6e5) trains
in float32; under ``mixed_float16`` its head's predictions pass 65504 once they near the
targets, some epochs in, and the loss is inf from then on. Nothing in the first steps shows it:
the initial predictions are near 0, every layer's activations fit float16, and a 100-step trial
is stable. The targets themselves are known before any trial, so they are read here, in the
float32 diagnostics, for each model output compared element by element with its targets (a
regression's shape; a classifier's sparse labels are indices, not values to produce):

- **range** (float16 only): targets beyond float16's largest value divided by
  ``HEAD_HEADROOM`` (predictions overshoot their targets while they learn);
- **resolution** (either 16-bit dtype): targets whose spread a cast to the dtype erases
  (tuner.worker.diagnostics.continuous_inputs' measure, relative to the targets' own spread):
  the head cannot tell the targets apart.

The layer that produces such an output (and, where it has no weights, the layers behind it up to
the first one that has: a ``Rescaling`` after the ``Dense``) is named with the compute dtypes in
which it must stay float32 (``output_heads``, plain data). The search then keeps it in float32
in every config that computes in such a dtype (``SearchSpace.output_heads``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tuner.worker.diagnostics.continuous_inputs import (
    ERASING_NOISE,
    SIXTEEN_BIT,
    rounding_noise,
    step_at,
)

FLOAT16_MAX = 65504.0
HEAD_HEADROOM = 4.0   # as tuner.judging.layer_risk's score: two doublings from overflow
_MAX_VALUES = 65536   # per output, over all the diagnostics steps


def _elementwise(prediction_shape, target_shape) -> bool:
    """Whether a prediction is compared with its target value by value: the same shape, or a
    last axis of 1 that the target leaves out."""
    prediction, target = tuple(prediction_shape), tuple(target_shape)
    return prediction == target or (len(prediction) == len(target) + 1
                                    and prediction[-1] == 1 and prediction[:-1] == target)


def _producers(prediction, captured: list) -> list[tuple[str, Any]]:
    """The layer whose call returned ``prediction`` (by identity, else the last call with its
    shape), then, while the layer has no weights, the one layer feeding it."""
    from tuner.apply.keras_internals import inbound_nodes

    found = next(((path, layer) for path, layer, tensor in reversed(captured)
                  if tensor is prediction), None) or next(
        ((path, layer) for path, layer, tensor in reversed(captured)
         if tuple(tensor.shape) == tuple(prediction.shape)), None)
    if found is None:
        return []
    paths = {id(layer): path for path, layer, _ in captured}
    chain = [found]
    while not chain[-1][1].weights and len(chain) < 8:
        nodes = inbound_nodes(chain[-1][1])
        parents = {id(parent.operation): parent.operation
                   for node in nodes for parent in getattr(node, "parent_nodes", [])}
        if len(parents) != 1:
            break
        parent = next(iter(parents.values()))
        if id(parent) not in paths:
            break
        chain.append((paths[id(parent)], parent))
    return chain


class OutputTargets:
    """Collects, over the diagnostics' steps, each output's targets and the layers producing it;
    ``entries`` then names the heads whose targets a 16-bit output cannot produce."""

    def __init__(self) -> None:
        self._heads: dict[int, list[tuple[str, Any]]] = {}
        self._targets: dict[int, list[np.ndarray]] = {}

    def observe(self, prediction, y, captured: list) -> None:
        import tensorflow as tf

        if y is None:
            return
        predictions, targets = tf.nest.flatten(prediction), tf.nest.flatten(y)
        if len(predictions) != len(targets):
            return
        for index, (output, target) in enumerate(zip(predictions, targets)):
            if not hasattr(output, "shape") or not hasattr(target, "shape") \
                    or not _elementwise(output.shape, target.shape):
                continue
            if index not in self._heads:
                self._heads[index] = _producers(output, captured)
            values = np.asarray(target, dtype=np.float64).ravel()
            self._targets.setdefault(index, []).append(values[np.isfinite(values)])

    def entries(self) -> list[dict[str, Any]]:
        found = []
        for index, parts in self._targets.items():
            heads = self._heads.get(index)
            values = np.concatenate(parts)[:_MAX_VALUES]
            if not heads or values.size < 2:
                continue
            needs = _needs_float32(values)
            if needs:
                found.append({"layer": heads[0][0], "class": type(heads[0][1]).__name__,
                              "layers": [path for path, _ in reversed(heads)],
                              "output": index, "min": float(values.min()),
                              "max": float(values.max()), "spread": float(np.std(values)),
                              "needs_float32_in": needs})
        return found


def _needs_float32(values: np.ndarray) -> dict[str, str]:
    """``{dtype: why}`` for each 16-bit compute dtype whose output cannot produce ``values``."""
    largest, spread = float(np.max(np.abs(values))), float(np.std(values))
    needs = {}
    if largest > FLOAT16_MAX / HEAD_HEADROOM:
        needs["float16"] = (f"targets up to {largest:.3g} pass float16's {FLOAT16_MAX:g} / "
                            f"{HEAD_HEADROOM:g} headroom")
    if spread > 0:
        typical = float(np.median(np.abs(values[values != 0]))) if np.any(values) else 0.0
        for dtype in SIXTEEN_BIT:
            noise, survive = rounding_noise(values, dtype, spread)
            if dtype not in needs and noise > ERASING_NOISE:
                step = step_at(typical, dtype)
                needs[dtype] = (f"{dtype}'s step at the targets' typical {typical:.3g} is "
                                f"{step:g}, {noise:.2g} of their spread {spread:.3g}: "
                                f"{survive} distinct values survive")
    return needs

