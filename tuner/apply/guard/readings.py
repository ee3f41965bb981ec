"""What the guard reads from Keras and hands on: the loss tracker and scalars of a training,
whether its weights went non-finite, and the float32 check's two evaluations.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from tuner.apply.guard import cause
from tuner.apply.keras_internals import compiled_loss, compiled_loss_tracker
from tuner.apply.loss_scaling import held_optimizers


def build_optimizer(model: keras.Model) -> None:
    """Build ``model.optimizer`` as Keras builds it for a model it builds itself, so that the
    first snapshot holds its state (else the snapshot after the first step does); not where
    the model holds optimizers of its own (its train_step may never apply compile's)."""
    optimizer = model.optimizer
    if optimizer is not None and not optimizer.built and model.built \
            and model.trainable_variables and len(held_optimizers(model)) == 1:
        optimizer.build(model.trainable_variables)


def traceable(model: keras.Model) -> bool:
    """Can the guard run the model on a batch itself (it has a ``call``)? A GAN written as the
    Keras guide writes one has none: its ``train_step`` calls its parts; there the guard
    watches the losses and the loss scales, and names no layer."""
    return type(model).call is not keras.Model.call


def loss_traceable(model: keras.Model) -> bool:
    """Can the guard compute the model's loss on a batch itself (a ``call`` and a compiled
    loss)? Where it cannot, it learns what a loss scale does from the model's own step."""
    return traceable(model) and compiled_loss(model) is not None


def evaluate_as_is_and_in_float32(model: keras.Model, data: Any) -> dict[str, float]:
    """The float32 check: the same weights evaluated as they train and with every layer in
    float32, which says what 16-bit compute costs the model now."""
    x, y = (data, None) if not isinstance(data, tuple) else (data[0], data[1])
    as_is = model.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    model.test_function = None
    try:
        with cause.computing_in_float32(model):
            in_float32 = model.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    finally:
        model.test_function = None
    return {"check_loss": float(as_is), "check_loss_float32": float(in_float32)}


def non_finite_weights(model: keras.Model) -> bool:
    return any(not np.all(np.isfinite(keras.ops.convert_to_numpy(w)))
               for w in model.trainable_weights)


def loss_tracker(model: keras.Model):
    """Keras's running-mean loss metric (or a custom ``train_step``'s own, named "loss")."""
    for metric in [compiled_loss_tracker(model), *model.metrics]:
        if metric is not None and getattr(metric, "name", None) == "loss" \
                and hasattr(metric, "total") and hasattr(metric, "count"):
            return metric
    return None


def scalar(value) -> float | None:
    if value is None:
        return None
    try:
        return float(keras.ops.convert_to_numpy(value))
    except (TypeError, ValueError):
        return None


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"PrecisionGuard: `{name}` must be an integer >= 1. Received: "
                         f"{name}={value!r}. Pass e.g. {name}=50.")
    return value
