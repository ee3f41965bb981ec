"""Per-layer numeric ranges, and what the diagnostics conclude from them (plain data out).

Each tensor is summarised by ``tensor_stats``: its largest magnitude; the fraction of values
that would overflow float16 (> 65504); the fraction of non-zero values that would underflow
float16 (flush to zero below 2^-24, or lose precision as subnormals below 2^-14); bfloat16's
mean relative rounding error; and a histogram of binary exponents, from which the share float16
flushes at any loss scale is read (tuner.judging.underflow). ``record_step`` merges one
instrumented step's tensors into per-layer records; ``diagnostics_from`` ranks the layers at
risk into float32 placement candidates, after the layers the input and target checks name,
and recommends an initial loss scale (both by tuner.judging.layer_risk's rules);
``unavailable`` is the same shape where no step could be traced. The steps themselves are
``diagnose``'s (a compiled loss) and ``diagnose_steps``' (a task's own ``train_step``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tuner.judging.layer_risk import (
    FLOAT16_MAX,
    FLOAT16_MIN_NORMAL,
    FLOAT16_MIN_SUBNORMAL,
    add_flushed_shares,
    float32_candidates,
    recommend_loss_scale,
    risk_score,
)


def tensor_stats(values) -> dict[str, float]:
    """Range statistics of one tensor, as plain floats. In numpy, in the tensor's own float32
    (float64 where it is that): no TensorFlow op per tensor, no sort (a diagnostics run takes
    a few hundred of these; in float64 with TensorFlow's bfloat16 cast they were half of it)."""
    import tensorflow as tf

    if isinstance(values, tf.IndexedSlices):  # embedding gradients: only the touched rows
        values = values.values
    array = np.asarray(values)
    array = array.astype(np.float64 if array.dtype == np.float64 else np.float32,
                         copy=False).ravel()
    is_finite = np.isfinite(array)
    finite_count = int(np.count_nonzero(is_finite))
    finite = array if finite_count == array.size else array[is_finite]
    magnitude = np.abs(finite)
    nonzero = magnitude[magnitude > 0]
    count = max(1, array.size)
    if nonzero.size:
        bf16_error = float(np.mean(np.abs(_as_bfloat16(nonzero) - nonzero) / nonzero,
                                   dtype=np.float64))
        small = float(np.percentile(nonzero, 1))
        # |v| in [2^e, 2^(e+1)): frexp's exponent less one (exact, where log2 rounds).
        exponents = np.frexp(nonzero)[1].astype(np.int64) - 1
        lowest = int(exponents.min())
        counts = np.bincount(exponents - lowest)
        histogram = {str(lowest + e): int(c) for e, c in enumerate(counts) if c}
    else:
        bf16_error, small, histogram = 0.0, 0.0, {}
    return {
        "abs_max": float(magnitude.max()) if magnitude.size else 0.0,
        "p01_nonzero": small,
        "non_finite_fraction": float((array.size - finite_count) / count),
        "overflow_fraction": float(np.count_nonzero(magnitude > FLOAT16_MAX) / count),
        "underflow_fraction": float(np.count_nonzero(nonzero < FLOAT16_MIN_SUBNORMAL)
                                    / max(1, nonzero.size)),
        "subnormal_fraction": float(np.count_nonzero(nonzero < FLOAT16_MIN_NORMAL)
                                    / max(1, nonzero.size)),
        "bf16_rel_error": bf16_error,
        # How many non-zero values have each binary exponent: |v| in [2^e, 2^(e+1)).
        "log2_counts": histogram,
    }


def _as_bfloat16(positive: np.ndarray) -> np.ndarray:
    """``positive`` (finite, > 0) rounded to bfloat16 as TensorFlow casts float32 to it: to the
    nearest of float32's top 16 bits, ties to even, subnormals kept (bit for bit on 2 million
    float32 patterns). The float64 cast this replaced flushed values below float32's normal
    range to zero, which a training's float32 -> bfloat16 cast does not."""
    bits = positive.astype(np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
        & np.uint32(0xFFFF0000)
    return rounded.view(np.float32).astype(positive.dtype)


def _merge(old: dict[str, float] | None, new: dict[str, float]) -> dict[str, float]:
    if old is None:
        return new
    merged = {key: max(old[key], new[key]) for key in old if key != "log2_counts"}
    counts = dict(old.get("log2_counts", {}))
    for exponent, count in new.get("log2_counts", {}).items():
        counts[exponent] = counts.get(exponent, 0) + count
    merged["log2_counts"] = counts
    merged["p01_nonzero"] = min(v for v in (old["p01_nonzero"], new["p01_nonzero"]) if v) \
        if old["p01_nonzero"] or new["p01_nonzero"] else 0.0
    return merged


def record_step(records: dict[str, dict[str, Any]], order: list[str], captured: list,
                activation_grads: list, weights: list, weight_grads: list) -> None:
    """Merge one step's activations, their gradients and the weight gradients into
    ``records`` (by layer path, first seen first in ``order``)."""
    for (name, layer, tensor), gradient in zip(captured, activation_grads):
        record = records.setdefault(name, {"layer": name, "class": type(layer).__name__,
                                           "activation": None, "gradient": None,
                                           "weight_gradient": None})
        if name not in order:
            order.append(name)
        record["activation"] = _merge(record["activation"], tensor_stats(tensor))
        if gradient is not None:   # None: not traceable (tuner.worker.diagnostics.diagnose_steps)
            record["gradient"] = _merge(record["gradient"], tensor_stats(gradient))
    owners = {id(w): name for name, layer, _ in captured for w in layer.trainable_weights}
    for weight, gradient in zip(weights, weight_grads):
        name = owners.get(id(weight))
        if name is not None and gradient is not None:
            records[name]["weight_gradient"] = _merge(records[name]["weight_gradient"],
                                                      tensor_stats(gradient))


def diagnostics_from(task, steps: int, layers: list[dict[str, Any]],
                     found: dict[str, list]) -> dict[str, Any]:
    """The diagnostics from what the instrumented steps recorded."""
    for layer in layers:
        layer["risk"] = risk_score(layer)
    grads = [layer["weight_gradient"] for layer in layers if layer["weight_gradient"]]
    grad_max = max((g["abs_max"] for g in grads), default=0.0)
    grad_p01 = min((g["p01_nonzero"] for g in grads if g["p01_nonzero"] > 0), default=0.0)
    candidates = float32_candidates(layers, _rounded_and_heads(found))
    loss_scale = recommend_loss_scale(grad_max, grad_p01)
    add_flushed_shares(layers, loss_scale["initial_scale"])
    return {"task": str(task.path), "steps": steps, "layers": layers,
            "candidates": candidates, **found, "loss_scale": loss_scale,
            "gradient_abs_max": grad_max, "gradient_p01_nonzero": grad_p01}


def unavailable(task, steps: int, why: str,
                findings: dict[str, list] | None = None) -> dict[str, Any]:
    """Diagnostics that could not be taken (``why``): no layer, Keras's own initial loss
    scale; the input and target checks where ``findings`` has them (``forward_findings``),
    their layers the only candidates. The search then runs on the space as written."""
    findings = {"integer_inputs": [], "continuous_inputs": [], "negligible_inputs": [],
                "output_heads": [], **(findings or {})}
    return {"task": str(task.path), "steps": steps, "layers": [],
            "candidates": float32_candidates([], _rounded_and_heads(findings)), **findings,
            "loss_scale": recommend_loss_scale(0.0, 0.0),
            "gradient_abs_max": 0.0, "gradient_p01_nonzero": 0.0, "unavailable": why}


def _rounded_and_heads(findings: dict[str, list]) -> list[str]:
    """The layers the input and target checks name, in that order."""
    return [*(e["layer"] for e in findings["integer_inputs"]),
            *(e["layer"] for e in findings["continuous_inputs"]),
            *(path for e in findings["output_heads"] for path in e["layers"])]
