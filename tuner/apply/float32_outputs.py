"""``float32.outputs``: a model's float outputs come out in float32, where it is the outermost
layer of the call. tuner.apply.scope wraps each model it sees constructed; ``cfg.apply(model)``
(tuner.apply.existing_model) wraps the model it is given."""

from __future__ import annotations

import functools
from typing import Any

import keras

from tuner.apply.keras_internals import current_call_entry_layer
from tuner.apply.layers import float_needing_cast

_FLOAT32 = "float32"


def cast_outputs_to_float32(model: keras.Model) -> None:
    """``float32.outputs``: the model's float outputs come out in float32 (Keras's mixed
    precision guide ends a model with a float32 layer for this), so the loss, the metrics and a
    custom ``train_step`` compute with float32 predictions. Only where the model is the
    outermost layer of the call (Keras's call context: its ``entry_layer``): a nested model's
    outputs feed 16-bit layers, or a parent's raw ops, and stay as they are. Wraps the model's
    ``call`` (an instance attribute, as the placements' hand-back does) when it is constructed,
    so it holds inside the scope (where the tuner's worker trains) and after it."""
    keras_call = model.call

    def to_float32(value: Any) -> Any:
        return keras.ops.cast(value, _FLOAT32) if float_needing_cast(value, _FLOAT32) \
            else value

    @functools.wraps(keras_call)
    def call(*args, **kwargs):
        output = keras_call(*args, **kwargs)
        entry = current_call_entry_layer()
        if entry is not None and entry is not model:
            return output
        return keras.tree.map_structure(to_float32, output)

    object.__setattr__(model, "call", call)
