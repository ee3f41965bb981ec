"""Continuous float inputs that 16-bit rounding erases: a large offset, a small spread.

Raw coordinates, timestamps, temperatures in kelvin, pressures in Pa, prices: a longitude near
-122 that spans 0.7 degrees is, in bfloat16, a multiple of 0.5 -- two values where there were
thousands. Keras casts a layer's float inputs to its compute dtype, so a ``Normalization``
layer adapted on such a feature standardises what is left of it: nothing fails, the loss may
still fall, the feature is gone. Two checks, plain data out, like ``integer_inputs`` (which
handles float tensors that carry integers):

- :class:`ContinuousInputs` (in the float32 diagnostics): for every float input of every layer
  and every feature of its last axis, the RMS error that a cast to each 16-bit dtype adds,
  relative to the feature's standard deviation, measured on the diagnostics batches; a feature
  float16 rounds whole to zero that the float32 model cannot use either is recorded apart
  (``negligible_inputs``, see :func:`negligible`): it keeps no layer in float32;
- :func:`continuous_check` (in a trial, before it trains, run by
  ``integer_inputs.first_rounding``): whether, under the trial's config, one of those layers
  receives such a feature in (or casts it to) a dtype that erases it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tuner.judging.erasure import severity, step_text, values_text

SIXTEEN_BIT = ("bfloat16", "float16")
# A feature is erased in a dtype when the cast adds RMS noise above this share of its standard
# deviation. A rounding step q adds noise q/sqrt(12), so 0.1 is a step of 0.35 standard
# deviations: fewer than ten values left across a uniform feature's range (3.5 of them), a
# feature binned coarsely rather than jittered. Well-scaled activations sit two orders of
# magnitude below it (bfloat16 rounds a value by at most 2^-8 of itself), so only a feature
# whose magnitude is about 45-90x its spread in bfloat16 (350-700x in float16) crosses it.
# Measured: the nearest miss in examples/ and tests/suites/zoo/ is a pooled conv feature in
# examples/audio_cnn.py (0.44..0.52, spread 0.019) at 0.04 in bfloat16.
ERASING_NOISE = 0.1
# The largest rounding error relative to the value (half a step): where the feature's largest
# |x| times this stays within ERASING_NOISE * spread, no cast can erase it, so it is not measured.
_HALF_STEP = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
_FLOAT16_MAX = 65504.0
_FLOAT16_HALF_SUBNORMAL = 2.0**-25   # float16's absolute rounding error below 2^-14
_MAX_VALUES = 2**18   # per layer call: a conv net's activations are subsampled to this by rows
_MIN_ROWS = 32
_MAX_ROWS = 8192      # per feature, over all the diagnostics steps
_KEPT_PER_LAYER = 3   # a wide input is reported by its worst few erased features
# negligible(): float32's resolution at 1 (its rounding step there is 2^-23, half of it 2^-24),
# and Keras's default backend.epsilon(), the floor under the standard deviation an adapted
# Normalization divides a feature by.
_FLOAT32_HALF_STEP_AT_1 = 2.0**-24
_KERAS_EPSILON = 1e-7
NEGLIGIBLE_BELOW = _FLOAT32_HALF_STEP_AT_1 * _KERAS_EPSILON   # 6e-15


def _numpy_dtype(name: str):
    import ml_dtypes  # numpy's own float16; bfloat16 from ml_dtypes, which Keras requires

    return np.float16 if name == "float16" else ml_dtypes.bfloat16


def _in_range(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` clipped to float16's range: what overflows is the overflow risk of the layer
    that made it (tuner.worker.diagnostics.diagnose), not rounding, and is not counted here."""
    return np.clip(values, -_FLOAT16_MAX, _FLOAT16_MAX) if dtype == "float16" else values


def _cast(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` rounded to ``dtype`` and back."""
    return values.astype(_numpy_dtype(dtype)).astype(np.float64)


def step_at(magnitude: float, dtype: str) -> float | None:
    """The distance between neighbouring ``dtype`` values at ``magnitude``; None past its
    largest value (float16 overflows)."""
    with np.errstate(over="ignore", invalid="ignore"):
        step = float(np.spacing(np.asarray(magnitude).astype(_numpy_dtype(dtype))))
    return step if np.isfinite(step) else None


def rounding_noise(values: np.ndarray, dtype: str, spread: float) -> tuple[float, int]:
    """The RMS error a cast of ``values`` to ``dtype`` adds, relative to ``spread``, and how
    many distinct values survive it (float16's overflow clipped away: see ``_in_range``)."""
    exact = _in_range(values, dtype)
    rounded = _cast(exact, dtype)
    return float(np.sqrt(np.mean((rounded - exact) ** 2)) / spread), int(np.unique(rounded).size)


def suspects(table: np.ndarray) -> list[int]:
    """The features (columns) of ``table`` whose values are large enough next to their spread
    for some 16-bit cast to cross ERASING_NOISE: the only ones worth measuring."""
    if table.shape[0] < 2:
        return []
    largest, spread = np.max(np.abs(table), axis=0), np.std(table, axis=0)
    safe_bf16 = largest * _HALF_STEP["bfloat16"] <= ERASING_NOISE * spread
    safe_f16 = (np.minimum(largest, _FLOAT16_MAX) * _HALF_STEP["float16"]
                + _FLOAT16_HALF_SUBNORMAL <= ERASING_NOISE * spread)
    return [int(feature) for feature in np.flatnonzero(~(safe_bf16 & safe_f16) & (spread > 0))]


def erasure(values: np.ndarray) -> dict[str, Any] | None:
    """What casting one feature's values to each 16-bit dtype does to them, as plain data;
    None when no 16-bit dtype erases it, or it is constant, or its values are integers (exact,
    or tuner.worker.diagnostics.integer_inputs' business)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    spread = float(np.std(values)) if values.size > 1 else 0.0
    if spread == 0 or np.all(values == np.round(values)):
        return None
    magnitudes = np.abs(values[values != 0])  # a ReLU's zeros say nothing about its scale
    typical = float(np.median(magnitudes))
    noise, survive, step = {}, {}, {}
    for dtype in SIXTEEN_BIT:
        noise[dtype], survive[dtype] = rounding_noise(values, dtype, spread)
        step[dtype] = step_at(typical, dtype)
    erased_in = [dtype for dtype in SIXTEEN_BIT if noise[dtype] > ERASING_NOISE]
    if not erased_in:
        return None
    return {"min": float(values.min()), "max": float(values.max()), "spread": spread,
            "distinct": int(np.unique(values).size), "survive": survive, "step": step,
            "noise": noise, "erased_in": erased_in}


def negligible(entry: dict[str, Any], input_abs_max: float) -> bool:
    """Whether an erased feature (an ``erasure`` entry) is zero to the float32 model too, so
    that float16 rounding it to zero loses nothing: a tensor that is zero in float32 has
    nothing for float16 to erase (a dead sensor's ~1e-21 noise next to readings of ~1000).
    Two conditions, both needed:

    - its largest magnitude is below NEGLIGIBLE_BELOW (2^-24 * 1e-7, about 6e-15). float16
      rounds all of it to 0 (its smallest subnormal is 2^-24), and even the layer that could
      lift it most, an adapted ``Normalization`` (it divides by the feature's standard
      deviation, floored at Keras's epsilon 1e-7), leaves it within float32's step at 1 (2^-23),
      next to standardised features of about 1;
    - the same input carries values at least 2^24 times larger (``input_abs_max``, its largest
      magnitude over every feature): a float32 sum that takes both (a Dense, a convolution, an
      Add, at weights of comparable size) rounds its share away. Without this, a model whose
      every input is tiny (quantities in SI units of 1e-21) would hide that float16 erases all
      of its inputs.

    A constant or all-zero feature never gets here (``erasure`` skips it)."""
    largest = max(abs(entry["min"]), abs(entry["max"]))
    return largest < NEGLIGIBLE_BELOW and largest <= _FLOAT32_HALF_STEP_AT_1 * input_abs_max


def erased_features(table: np.ndarray) -> list[dict[str, Any]]:
    """``erasure`` of every feature (column) of a ``(rows, features)`` array that some 16-bit
    dtype erases, with its ``feature`` index."""
    table = np.asarray(table, dtype=np.float64)
    found = [(feature, erasure(table[:, feature])) for feature in suspects(table)]
    return [{"feature": feature, **entry} for feature, entry in found if entry]


def _sample_rows(leaf) -> np.ndarray | None:
    """A layer input as ``(rows, features of its last axis)`` float64, rows evenly subsampled
    to at most _MAX_VALUES values, finite rows only; None for a scalar or an empty tensor."""
    import tensorflow as tf

    # Dense eager values only: a traced call's tensors have none, ragged ones no last axis.
    if not isinstance(leaf, (tf.Tensor, tf.Variable)) or not hasattr(leaf, "numpy") \
            or leaf.shape.rank == 0 or leaf.shape.num_elements() == 0:
        return None
    features = int(leaf.shape[-1]) if leaf.shape.rank > 1 else 1
    flat = tf.reshape(leaf, (-1, features))
    rows = int(flat.shape[0])
    keep = max(_MIN_ROWS, _MAX_VALUES // features)
    if rows > keep:  # subsample before leaving the device: only the kept rows are copied
        flat = tf.gather(flat, np.linspace(0, rows - 1, keep).astype(np.int64))
    table = np.asarray(flat.numpy(), dtype=np.float64)
    return table[np.all(np.isfinite(table), axis=1)]


class ContinuousInputs:
    """Collects, over the diagnostics' layer calls, the values of the features that a 16-bit
    cast might erase (:func:`suspects`, judged per call), and measures them at the end over
    every batch they were suspect in."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, int, int], list[np.ndarray]] = {}
        self._classes: dict[str, str] = {}
        self._largest: dict[tuple[str, int], float] = {}   # each float input's largest |x|

    def observe(self, layer, path: str, args: tuple, kwargs: dict) -> None:
        import keras

        from tuner.worker.diagnostics.integer_inputs import float_leaves

        if isinstance(layer, keras.Model):  # the layers inside it receive them too
            return
        for index, leaf in enumerate(float_leaves(args, kwargs)):
            table = _sample_rows(leaf)
            if table is None or table.size == 0:
                continue
            largest = float(np.max(np.abs(table)))
            self._largest[path, index] = max(self._largest.get((path, index), 0.0), largest)
            for feature in suspects(table):
                self._values.setdefault((path, index, feature), []).append(table[:, feature])
                self._classes[path] = type(layer).__name__

    def findings(self) -> dict[str, list[dict[str, Any]]]:
        """The erased features (``continuous_inputs``) and, apart, the :func:`negligible` ones
        (``negligible_inputs``): of each layer the worst _KEPT_PER_LAYER, in call order, each
        with ``of_layer``, how many such features the layer receives in all."""
        erased: dict[str, list[dict[str, Any]]] = {}
        zero: dict[str, list[dict[str, Any]]] = {}
        for (path, index, feature), parts in self._values.items():
            entry = erasure(np.concatenate(parts)[:_MAX_ROWS])
            if entry is None:
                continue
            largest = self._largest[path, index]
            found = zero if negligible(entry, largest) else erased
            found.setdefault(path, []).append(
                {"layer": path, "class": self._classes[path], "input": index,
                 "feature": feature, **entry, "input_abs_max": largest})
        return {"continuous_inputs": _worst_of_each(erased),
                "negligible_inputs": _worst_of_each(zero)}


def _worst_of_each(by_layer: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    for entries in by_layer.values():
        entries.sort(key=severity)
        kept += [{**entry, "of_layer": len(entries)} for entry in entries[:_KEPT_PER_LAYER]]
    return kept


def _reason(entry: dict[str, Any], arrives: str, computes: str) -> str:
    name = entry["layer"]
    which = "its inputs" if entry["input"] == 0 else f"its float input {entry['input']}"
    how = (f"arrives as {arrives} from the model's Input or the layers before it"
           if arrives != "float32" else f"is cast to {computes}")
    fix = (f"keep {name} in float32 (float32.layers: [{name}]) or subtract the feature's offset "
           "before the model" if arrives == "float32" else
           "declare the model's Input with dtype='float32' (or keep the layers before it in "
           f"float32) and keep {name} in float32 (float32.layers: [{name}])")
    return (f"input rounding in layer {name}: feature {entry['feature']} of {which} "
            f"({values_text(entry)}) {how}, whose {step_text(entry, computes)}: "
            f"{entry['survive'][computes]} of {entry['distinct']} distinct values survive; "
            f"fix: {fix}")


def continuous_check(expected: Sequence[dict[str, Any]]) -> Callable:
    """A check for ``integer_inputs.first_rounding``: a layer in ``expected`` (the diagnostics'
    ``continuous_inputs``) that receives a feature in, or casts it to, a dtype that erases it."""
    by_layer: dict[str, list[dict[str, Any]]] = {}
    for entry in expected:
        by_layer.setdefault(entry["layer"], []).append(entry)

    def check(layer, path: str, index: int, arrives: str, computes: str):
        for entry in by_layer.get(path) or by_layer.get(layer.name) or ():
            if entry["input"] == index and computes in entry["erased_in"]:
                return entry["layer"], _reason(entry, arrives, computes)
        return None

    return check
