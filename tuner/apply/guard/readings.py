"""What the guard reads from Keras and hands on: the loss tracker and scalars of a training,
whether its weights went non-finite, and the float32 check's two evaluations.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from tuner.apply.guard import cause
from tuner.apply.loss_scaling import held_optimizers
from tuner.errors import UsageError


def refuse_several_optimizers(model: keras.Model) -> None:
    """The guard watches one optimizer, ``model.optimizer`` (its loss scale, its skipped
    steps, its state to restore): a model that trains with optimizers of its own (a GAN's
    ``d_optimizer`` and ``g_optimizer``) is refused in one line rather than watched wrongly."""
    own = sorted(name for name in held_optimizers(model) if name != "optimizer")
    if own:
        raise UsageError(f"precision guard: {type(model).__name__} trains with optimizers of its "
                         f"own ({', '.join(own)}), and the guard watches model.optimizer alone. "
                         "Train it without the guard (precision-tuner train --no-guard "
                         "compares it with float32 over the whole training).")


def refuse_data_under_distribution(model: keras.Model, data: Any) -> None:
    """Under ``tf.distribute`` the model's variables are mirrored, and the probe that names a
    layer (``cause.probe``) cannot take their gradients outside a replica: ``data=`` there is
    refused in one line rather than failing at the first trip (the guard goes on without a
    batch: it restores and rescales, naming no layer)."""
    import tensorflow as tf

    if data is not None and any(isinstance(variable.value, tf.distribute.DistributedValues)
                                for variable in model.trainable_variables[:1]):
        raise UsageError("precision guard: data= cannot be diagnosed on under tf.distribute "
                         "(no layer probe outside a replica); leave data= out: the guard then "
                         "restores and rescales, without naming a layer")


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
    for metric in [getattr(model, "_loss_tracker", None), *model.metrics]:
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


def iterations(model: keras.Model) -> int:
    """Updates applied so far (a loss scale's skipped steps do not count)."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))
