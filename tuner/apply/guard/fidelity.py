"""Silent failures: a layer whose 16-bit output is finite and wrong. An intermediate inside the
layer's own call overflows and the next op turns inf into a finite value (``rsqrt(inf) = 0`` in
a hand-written norm, ``1/inf``, ``exp(-inf)``, a saturating gate): nothing is NaN, no update is
skipped, the loss merely stops improving. Only the layer's output against the same layer
computed in float32 from the same input shows it.

``compare_layers`` runs the model forward on a batch in inference mode (no statistics move, no
dropout), keeps each 16-bit layer's inputs and output, and calls each layer again on the same
inputs with its compute (and its sublayers') in float32. Each sample's disagreement is
``|out16 - out32| / |out32|`` (norms over the sample's features); 16-bit rounding explains a
few hundred units in the last place (bfloat16: 2^-8 each, float16: 2^-11), a sample whose
output is off by half its size (``BROKEN``) is not rounding. A layer with a broken sample is
reported; of a layer and the layers inside it, the innermost reported one is the cause.
``output_gap`` is the mean disagreement of the whole model's output (how far the model as it
runs is from the model in float32): a repair is kept only where it brings that gap down.

Cost: one eager forward pass and one float32 call per 16-bit layer, on one batch, no backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from tuner.apply.guard.cause import computing_in_float32
from tuner.apply.layers import call_path, hook_layer_calls, layer_paths

BROKEN = 0.5          # a sample's relative disagreement that no 16-bit rounding explains
SIXTEEN_BIT = ("float16", "bfloat16")


@dataclass(frozen=True)
class Disagreement:
    """One layer's 16-bit output against its float32 computation on the same inputs."""

    layer: str
    dtype: str
    worst: float           # the largest per-sample relative disagreement
    broken: float          # the share of samples disagreeing by more than BROKEN

    def describe(self) -> str:
        return (f"{self.layer}'s {self.dtype} output disagrees with its float32 computation "
                f"on {self.broken:.0%} of the batch (worst sample off by {self.worst:.3g}x "
                "its size)")


def compare_layers(model: keras.Model, x: Any) -> list[Disagreement]:
    """The 16-bit layers whose output on ``x`` no rounding explains, innermost first."""
    import tensorflow as tf

    calls: list[tuple[keras.layers.Layer, str, tuple, dict, Any]] = []
    pending: list[tuple[keras.layers.Layer, str, tuple, dict] | None] = []

    def before(layer, args, kwargs) -> None:
        watched = not isinstance(layer, keras.Model) and layer.compute_dtype in SIXTEEN_BIT
        pending.append((layer, call_path(layer), args, dict(kwargs)) if watched else None)

    def after(layer, output) -> None:
        entry = pending.pop() if pending else None
        if entry is not None and entry[0] is layer:
            calls.append((*entry, output))

    with hook_layer_calls(before=before, after=after):
        model(x, training=False)
    found, seen = [], set()
    for layer, path, args, kwargs, output in calls:
        if id(layer) in seen:
            continue  # a shared layer: its first call speaks for it
        seen.add(id(layer))
        again = _in_float32(layer, args, kwargs)
        if again is None:
            continue
        worst, broken, _ = _disagreement(tf.nest.flatten(output), tf.nest.flatten(again))
        if broken > 0:
            found.append(Disagreement(path, layer.compute_dtype, worst, broken))
    return _innermost(model, found)


def weighted_sixteen_bit(model: keras.Model) -> int:
    """How many layers with weights compute in 16 bits."""
    return sum(1 for layer, _ in layer_paths(model)
               if layer.compute_dtype in SIXTEEN_BIT and layer.weights)


def output_gap(model: keras.Model, x: Any) -> float:
    """How far the model's output, as the model runs now, is from the same model run with
    every layer in float32: the mean per-sample relative disagreement."""
    import tensorflow as tf

    as_is = model(x, training=False)
    with computing_in_float32(model):
        in_float32 = model(x, training=False)
    return _disagreement(tf.nest.flatten(as_is), tf.nest.flatten(in_float32))[2]


def _in_float32(layer: keras.layers.Layer, args: tuple, kwargs: dict):
    import tensorflow as tf

    def upcast(value):
        if isinstance(value, tf.Tensor) and value.dtype.is_floating:
            return tf.cast(value, tf.float32)
        return value

    try:
        with computing_in_float32(layer):
            return layer(*tf.nest.map_structure(upcast, args),
                         **tf.nest.map_structure(upcast, kwargs))
    except Exception:  # noqa: BLE001 - a layer that cannot run alone (state, dtypes): skip it
        return None


def _disagreement(low: list, high: list) -> tuple[float, float, float]:
    """(worst per-sample relative disagreement, share of samples beyond BROKEN, mean
    disagreement), over the float outputs both calls returned; samples whose float32 output is
    not finite are left out (float32 fails there too: not a 16-bit fault)."""
    worst, broken, samples, total = 0.0, 0, 0, 0.0
    for a, b in zip(low, high):
        if not (hasattr(a, "dtype") and hasattr(b, "dtype") and a.dtype.is_floating
                and b.dtype.is_floating and a.shape == b.shape and a.shape.rank):
            continue
        a = np.asarray(a, dtype=np.float64).reshape(a.shape[0], -1)
        b = np.asarray(b, dtype=np.float64).reshape(b.shape[0], -1)
        keep = np.all(np.isfinite(b), axis=1)
        a, b = a[keep], b[keep]
        if not len(b):
            continue
        size = np.linalg.norm(b, axis=1)
        floor = 1e-2 * float(np.median(size)) + 1e-30  # a near-zero sample has no scale
        with np.errstate(invalid="ignore", over="ignore"):
            error = np.linalg.norm(a - b, axis=1) / (size + floor)
        error = np.where(np.isfinite(error), error, np.inf)
        worst = max(worst, float(error.max()))
        broken += int(np.sum(error > BROKEN))
        total += float(np.sum(np.minimum(error, 1e6)))
        samples += len(b)
    if not samples:
        return 0.0, 0.0, 0.0
    return worst, broken / samples, total / samples


def _innermost(model: keras.Model, found: list[Disagreement]) -> list[Disagreement]:
    """Of a reported layer and reported layers inside it, keep the inner ones: an outer
    layer's output is wrong because an inner one's is."""
    inside: dict[str, set[str]] = {}
    for layer, path in layer_paths(model):
        inside[path] = {inner for _, inner in layer_paths(layer)}
    paths = {item.layer for item in found}
    return [item for item in found if not (inside.get(item.layer, set()) & paths)]
