"""Float tensors that carry integers (token ids, indices, counts, positions) and 16-bit rounding.

Keras casts a layer's float inputs to its compute dtype. bfloat16 holds every integer exactly
only up to 2^8 = 256 and float16 up to 2^11 = 2048; above that, ids are rounded: different
tokens share one embedding row, and an id near the top of a vocabulary can round past it. Where
the rounding stays in range nothing fails, so a trial could look stable while the model has
lost information. Two checks, both plain data out:

- :func:`integer_inputs_of` (in the float32 diagnostics): which layers receive float tensors
  whose values are all integers, larger than the smallest 16-bit exact range;
- :func:`rounding_of` (in a trial, before it trains): whether, under the trial's config, any of
  those layers receives them in (or casts them to) a dtype that cannot hold them exactly.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

# The largest n such that every integer in [-n, n] is exact: 2^(significand bits).
EXACT_INTEGER_LIMIT = {"bfloat16": 2**8, "float16": 2**11, "float32": 2**24, "float64": 2**53}
_SMALLEST_LIMIT = min(EXACT_INTEGER_LIMIT.values())


def integer_valued_max(value: Any) -> float | None:
    """The largest magnitude in a float tensor whose values are all integers, else None."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not getattr(dtype, "is_floating", False) or not hasattr(value, "numpy"):
        return None
    array = np.asarray(value.numpy(), dtype=np.float64)
    if array.size == 0 or not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
        return None
    return float(np.max(np.abs(array)))


def _float_leaves(args: tuple, kwargs: dict) -> list[Any]:
    import tensorflow as tf

    return [leaf for leaf in tf.nest.flatten((args, kwargs))
            if getattr(getattr(leaf, "dtype", None), "is_floating", False)]


def integer_inputs_of(layer, path: str, args: tuple, kwargs: dict,
                      found: dict[str, dict[str, Any]]) -> None:
    """Record in ``found`` (by path) a layer receiving integer-valued floats above 256."""
    import keras

    if isinstance(layer, keras.Model):  # the layers inside it receive them too
        return
    for leaf in _float_leaves(args, kwargs):
        largest = integer_valued_max(leaf)
        if largest is not None and largest > _SMALLEST_LIMIT:
            entry = found.setdefault(path, {"layer": path, "class": type(layer).__name__,
                                            "max": largest})
            entry["max"] = max(entry["max"], largest)


def rounding_of(model, x, expected: Sequence[dict[str, Any]]) -> tuple[str, str] | None:
    """Run the forward pass once, eagerly, and check each layer in ``expected`` (from the
    diagnostics): ``(layer, reason)`` for the first that gets its integers in a dtype that
    cannot hold them exactly, else None."""
    import keras

    from tuner.keras_apply import call_path, hook_layer_calls

    wanted = {entry["layer"]: entry for entry in expected}
    found: list[tuple[str, str]] = []

    def check(layer, args, kwargs) -> None:
        path = call_path(layer)
        entry = wanted.get(path) or wanted.get(layer.name)
        if entry is None:
            return
        for leaf in _float_leaves(args, kwargs):
            arrives = keras.backend.standardize_dtype(leaf.dtype)
            casts = layer.autocast and keras.backend.is_float_dtype(layer.compute_dtype)
            computes = layer.compute_dtype if casts and arrives == "float32" else arrives
            limit = EXACT_INTEGER_LIMIT.get(computes)
            if limit is None or entry["max"] <= limit:
                continue
            name = entry["layer"]
            how = (f"arrive as {arrives} from the layers before it" if arrives != "float32"
                   else f"are cast to {computes}")
            fix = (f"keep {name} in float32 (float32.layers: [{name}]) or feed them as int32"
                   if arrives == "float32" else
                   "declare the model's Input with dtype='int32' (or 'float32'), or keep the "
                   "layers before it in float32")
            found.append((name, f"integer rounding in layer {name}: its integer-valued float "
                                f"inputs (up to {entry['max']:.0f}) {how}, exact only up to "
                                f"{limit}; fix: {fix}"))
            raise _Rounded()  # stop at the first: what follows computes on rounded ids

    try:
        with hook_layer_calls(before=check):
            model(x, training=False)
    except _Rounded:  # Keras may re-raise it with its own message: `found` holds ours
        pass
    return found[0] if found else None


class _Rounded(Exception):
    """Raised out of the forward pass at the first layer that would round its integers."""
