"""Where a failure comes from, found on the batch it happened on, and the repairs that act on
one layer, each verified on that batch before it is kept.

``probe`` runs the model as it is now (its 16-bit layers in 16 bits) forward and backward on
the batch, eagerly, watching every layer call (``tuner.apply.instruments.traced_step``): the
first layer whose output is non-finite (a float16 output past 65504 is inf), else, going back
from the loss, the layer whose backward pass made a gradient non-finite at the current loss
scale. ``place_in_float32`` moves a built layer to float32 with Keras's per-layer dtype policy
(weights under a mixed policy are float32 already, so nothing is rebuilt), through the
placements' own ``Float32Placer.place_in_built_model``, so that a subclassed owner that mixes
the layer's output into raw 16-bit ops still gets its own dtype back.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator

import keras

from tuner.apply.config_data import ConfigData
from tuner.apply.instruments import first_non_finite, non_finite, traced_step
from tuner.apply.layers import layer_paths
from tuner.apply.scope import Float32Placer

FLOOR_HEADROOM = 4   # a lowered floor sits 2^4 below the scale that one batch fits


@dataclass
class Probe:
    """What one forward and backward pass on the batch showed."""

    data_non_finite: bool = False
    forward: str | None = None         # first layer whose output is non-finite
    loss_finite: bool = True
    backward: str | None = None        # layer whose backward made a gradient non-finite
    traced: bool = True                # False: the model could not be run on the batch
    notes: list[str] = field(default_factory=list)

    @property
    def failing(self) -> bool:
        return self.data_non_finite or self.forward is not None or not self.loss_finite \
            or self.backward is not None

    @property
    def failing_forward(self) -> bool:
        return self.data_non_finite or self.forward is not None or not self.loss_finite

    @property
    def layer(self) -> str | None:
        return self.forward or self.backward

    def describe(self) -> str:
        if self.data_non_finite:
            return "the batch itself holds NaN or inf"
        if self.forward:
            return f"{self.forward}'s output is non-finite"
        if not self.loss_finite:
            return "every layer's output is finite but the loss is not"
        if self.backward:
            return f"{self.backward}'s backward pass overflows at this loss scale"
        if not self.traced:
            return "no layer diagnosed (the model has no call to run on the batch)"
        return "nothing non-finite on this batch"


def data_non_finite(batch: Any) -> bool:
    """NaN or inf in the batch's inputs, targets or sample weights: a data fault, not a
    precision one."""
    import tensorflow as tf

    return any(non_finite(t) for t in tf.nest.flatten(batch) if isinstance(t, tf.Tensor))


def probe(model: keras.Model, batch: Any, loss_scale: float | None) -> Probe:
    found = Probe()
    if data_non_finite(batch):
        found.data_non_finite = True
        return found
    try:
        step = traced_step(model, batch, loss_scale=loss_scale)
    except Exception as exc:  # noqa: BLE001 - no call to run it by (a GAN's train_step)
        found.notes.append(f"the model cannot be run on the batch ({type(exc).__name__})")
        found.traced = False
        return found
    if step.loss_error is not None:
        found.notes.append(f"no compiled loss to trace ({type(step.loss_error).__name__})")
    found.forward = first_non_finite(step.captured)
    if step.loss is None or found.forward is not None:
        return found
    found.loss_finite = not non_finite(step.loss)
    if not found.loss_finite:
        return found
    output_grads, weights, weight_grads = step.gradients()
    found.backward = _backward_culprit(step.captured, output_grads,
                                       dict(zip(map(id, weights), weight_grads)))
    return found


def largest_fitting_scale(model: keras.Model, batch: Any, low: int, high: int) -> float | None:
    """The largest ``2^e`` for ``low <= e <= high`` at which the batch's backward pass is
    finite, None if none is."""
    return largest_passing(lambda e: not probe(model, batch, 2.0**e).failing, low, high)


def largest_passing(passes, low: int, high: int) -> float | None:
    """The largest ``2^e`` for ``low <= e <= high`` where ``passes(e)``, bisected (a scale
    at which gradients overflow overflows above it too), None where none does."""
    if not passes(low):
        return None
    if passes(high):
        return 2.0**high
    while high - low > 1:
        middle = (low + high) // 2
        if passes(middle):
            low = middle
        else:
            high = middle
    return 2.0**low


def _backward_culprit(captured: list, output_grads: list, weight_grads: dict) -> str | None:
    """Going back from the loss: a layer whose weight gradients are non-finite while the
    gradient reaching its output is finite made them so; a non-finite gradient at a layer's
    output was made by the backward pass of the layer called after it."""
    for index in range(len(captured) - 1, -1, -1):
        path, layer, _ = captured[index]
        if non_finite(output_grads[index]):
            return captured[index + 1][0] if index + 1 < len(captured) else path
        if any(non_finite(weight_grads.get(id(w))) for w in layer.trainable_weights):
            return path
    return None


def find_layer(model: keras.Model, path: str) -> keras.layers.Layer | None:
    return next((layer for layer, found in layer_paths(model) if found == path), None)


def place_in_float32(model: keras.Model, config: ConfigData, path: str) -> list:
    """Move the layer at ``path`` (and what it contains) to float32 compute; returns the
    ``(layer, previous policy)`` pairs it changed, for ``undo``."""
    if path == model.name and model.dtype_policy.name != "float32":
        # The model itself: its own call casts the inputs to its compute dtype (a subclassed
        # model's features rounded to bfloat16 before the first layer sees them).
        changed = [(model, model.dtype_policy)]
        model.dtype_policy = keras.DTypePolicy("float32")
        return changed
    layer = find_layer(model, path)
    if layer is None:
        return []
    before = [(member, member.dtype_policy) for member in
              [layer] + [sub for sub, _ in layer_paths(layer)]]
    placement = dataclasses.replace(config.float32, groups=(), layers=(path,), outputs=False)
    placer = Float32Placer(dataclasses.replace(config, float32=placement))
    placer.place_in_built_model(model, layer, path)
    return [(member, policy) for member, policy in before
            if member.dtype_policy.name != policy.name]


def whole_model_float32(model: keras.Model) -> list:
    """Every layer (and the model, whose inputs it casts) to float32 compute."""
    changed = []
    for member in [model] + [layer for layer, _ in layer_paths(model)]:
        if member.dtype_policy.name != "float32":
            changed.append((member, member.dtype_policy))
            member.dtype_policy = keras.DTypePolicy("float32")
    return changed


def undo(changed: list) -> None:
    for member, policy in changed:
        member.dtype_policy = policy


@contextlib.contextmanager
def computing_in_float32(root: keras.layers.Layer) -> Iterator[None]:
    """``root`` and every layer inside it compute in float32 within the block (for a
    comparison), as they were after it."""
    changed = whole_model_float32(root)
    try:
        yield
    finally:
        undo(changed)


def retrace(model: keras.Model) -> None:
    """Dtype policies are read when a step is traced: make the step functions anew."""
    model.make_train_function(force=True)
    model.test_function = None
    model.predict_function = None
