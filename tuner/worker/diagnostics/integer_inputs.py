"""Float tensors that carry integers (token ids, indices, counts, positions) and 16-bit rounding.

Keras casts a layer's float inputs to its compute dtype. bfloat16 holds every integer exactly
only up to 2^8 = 256 and float16 up to 2^11 = 2048; above that, ids are rounded: different
tokens share one embedding row, and an id near the top of a vocabulary can round past it. Where
the rounding stays in range nothing fails, so a trial could look stable while the model has
lost information. Two checks, both plain data out:

- :func:`integer_inputs_of` (in the float32 diagnostics): which layers receive float tensors
  whose values are all integers, larger than the smallest 16-bit exact range;
- :func:`integer_check` (in a trial, before it trains, run by :func:`first_rounding`): whether,
  under the trial's config, any of those layers receives them in (or casts them to) a dtype
  that cannot hold them exactly.

:func:`first_rounding` and :func:`arrival` also serve tuner.worker.diagnostics.continuous_inputs.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

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


def float_leaves(args: tuple, kwargs: dict) -> list[Any]:
    """A layer call's float tensors, in ``tf.nest.flatten`` order (the index the checks use)."""
    import tensorflow as tf

    return [leaf for leaf in tf.nest.flatten((args, kwargs))
            if getattr(getattr(leaf, "dtype", None), "is_floating", False)]


def integer_inputs_of(layer, path: str, args: tuple, kwargs: dict,
                      found: dict[str, dict[str, Any]]) -> None:
    """Record in ``found`` (by path) a layer receiving integer-valued floats above 256."""
    import keras

    if isinstance(layer, keras.Model):  # the layers inside it receive them too
        return
    for leaf in float_leaves(args, kwargs):
        largest = integer_valued_max(leaf)
        if largest is not None and largest > _SMALLEST_LIMIT:
            entry = found.setdefault(path, {"layer": path, "class": type(layer).__name__,
                                            "max": largest})
            entry["max"] = max(entry["max"], largest)


def arrival(layer, leaf) -> tuple[str, str]:
    """``(arrives, computes)``: the dtype a float input reaches ``layer`` in, and the one the
    layer computes it in. Keras autocasts only float32 inputs to the compute dtype; a 16-bit
    input stays as it came (its rounding happened before, in the layers that made it)."""
    import keras

    arrives = keras.backend.standardize_dtype(leaf.dtype)
    casts = layer.autocast and keras.backend.is_float_dtype(layer.compute_dtype)
    return arrives, (layer.compute_dtype if casts and arrives == "float32" else arrives)


def integer_check(expected: Sequence[dict[str, Any]]) -> Callable:
    """A check for :func:`first_rounding`: a layer in ``expected`` (the diagnostics'
    ``integer_inputs``) that gets its integers in a dtype that cannot hold them exactly."""
    wanted = {entry["layer"]: entry for entry in expected}

    def check(layer, path: str, index: int, arrives: str, computes: str):
        entry = wanted.get(path) or wanted.get(layer.name)
        limit = EXACT_INTEGER_LIMIT.get(computes)
        if entry is None or limit is None or entry["max"] <= limit:
            return None
        name = entry["layer"]
        how = (f"arrive as {arrives} from the layers before it" if arrives != "float32"
               else f"are cast to {computes}")
        fix = (f"keep {name} in float32 (float32.layers: [{name}]) or feed them as int32"
               if arrives == "float32" else
               "declare the model's Input with dtype='int32' (or 'float32'), or keep the "
               "layers before it in float32")
        return name, (f"integer rounding in layer {name}: its integer-valued float inputs "
                      f"(up to {entry['max']:.0f}) {how}, exact only up to {limit}; fix: {fix}")

    return check


def first_rounding(run: Callable[[], Any],
                   checks: dict[Any, Callable]) -> tuple[Any, str, str] | None:
    """Run the forward pass once, eagerly (``run()``), asking every check about every float
    input of every layer call (``check(layer, path, index, arrives, computes)`` returns
    ``(layer, reason)``
    or None): ``(tag, layer, reason)`` from the first that answers, else None."""
    from tuner.apply.layers import call_path, hook_layer_calls

    found: list[tuple[Any, str, str]] = []

    def ask(layer, args, kwargs) -> None:
        path = call_path(layer)
        for index, leaf in enumerate(float_leaves(args, kwargs)):
            arrives, computes = arrival(layer, leaf)
            for tag, check in checks.items():
                answer = check(layer, path, index, arrives, computes)
                if answer is not None:
                    found.append((tag, *answer))
                    raise _Rounded()  # stop at the first: what follows computes on rounded values

    try:
        with hook_layer_calls(before=ask):
            run()
    except _Rounded:  # Keras may re-raise it with its own message: `found` holds ours
        pass
    return found[0] if found else None


class _Rounded(Exception):
    """Raised out of the forward pass at the first layer that would round its inputs."""
