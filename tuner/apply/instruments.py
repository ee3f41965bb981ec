"""The instruments that read a model on a batch, one definition for the precision guard (in the
user's process, tuner.apply.guard) and the tuner's worker (its trials and diagnostics,
tuner.worker): every layer call's float output (``layer_outputs``) and the first of them that
is non-finite (``first_non_finite``); one training-mode forward and backward pass, eagerly,
with the gradients that reach those outputs and the weights (``traced_step``); and host copies
of variables, to put back (``HostCopy``).
"""

from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np

from tuner.apply.layers import call_path, hook_layer_calls

Captured = list[tuple[str, Any, Any]]   # (layer path, layer, float output), in call order


def non_finite(tensor) -> bool:
    """A float tensor (an ``IndexedSlices``' values) that holds NaN or inf; None is finite."""
    import tensorflow as tf

    if tensor is None:
        return False
    if isinstance(tensor, tf.IndexedSlices):
        tensor = tensor.values
    return bool(tensor.dtype.is_floating
                and not tf.reduce_all(tf.math.is_finite(tensor)).numpy())


def layer_outputs(layer, output) -> Captured:
    """A layer call's float outputs, as ``(path, layer, tensor)``: none for a model (the calls
    of its layers are seen one by one) nor for a symbolic call (there is nothing to read)."""
    import tensorflow as tf

    if isinstance(layer, keras.Model):
        return []
    return [(call_path(layer), layer, tensor) for tensor in tf.nest.flatten(output)
            if isinstance(tensor, tf.Tensor) and hasattr(tensor, "numpy")
            and tensor.dtype.is_floating]


def first_non_finite(captured: Captured) -> str | None:
    """The path of the first captured output that holds NaN or inf."""
    return next((path for path, _, tensor in captured if non_finite(tensor)), None)


class TracedStep:
    """One training-mode forward pass of ``model`` on ``batch``, eagerly, under a gradient tape
    (``traced_step``): every layer call's float output (``captured``), the ``prediction``, and
    the compiled ``loss``; None, with ``loss_error``, where the model cannot compute one (a
    ``train_step`` with a loss of its own)."""

    def __init__(self, model: keras.Model, batch: Any, before: Callable | None,
                 loss_scale: float | None) -> None:
        import tensorflow as tf

        x, self.y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        self.model = model
        self.captured: Captured = []
        self.loss = self.loss_error = self._scaled = None

        def capture(layer, output) -> None:
            self.captured.extend(layer_outputs(layer, output))

        with hook_layer_calls(before=before, after=capture), tf.GradientTape() as tape:
            self.prediction = model(x, training=True)
            try:
                self.loss = model.compute_loss(x=x, y=self.y, y_pred=self.prediction,
                                               sample_weight=sample_weight)
            except Exception as exc:  # noqa: BLE001 - the caller says what it means
                self.loss_error = exc
            else:
                self._scaled = self.loss * loss_scale if loss_scale else self.loss
        self._tape = tape

    def gradients(self) -> tuple[list, list, list]:
        """The gradients of the (scaled) loss reaching each captured output, the model's
        trainable weights, and their gradients (zero where a tensor does not reach the loss)."""
        import tensorflow as tf

        tensors = [tensor for _, _, tensor in self.captured]
        weights = self.model.trainable_weights
        gradients = self._tape.gradient(self._scaled, tensors + weights,
                                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return gradients[:len(tensors)], weights, gradients[len(tensors):]


def traced_step(model: keras.Model, batch: Any, *, before: Callable | None = None,
                loss_scale: float | None = None) -> TracedStep:
    """The forward pass of one training step on ``batch``, every layer call watched (``before``:
    a hook on each call's inputs as well), its loss multiplied by ``loss_scale`` for the
    gradients; ``.gradients()`` then runs the backward pass."""
    return TracedStep(model, batch, before, loss_scale)


class HostCopy:
    """Host copies of some variables' values, taken at once; ``put_back`` assigns them."""

    def __init__(self, variables: list) -> None:
        self.values = [np.array(keras.ops.convert_to_numpy(v)) for v in variables]

    @classmethod
    def of_values(cls, values: list) -> HostCopy:
        """A copy of values already read (``tuner.apply.guard.state.StateReader``)."""
        copy = cls([])
        copy.values = values
        return copy

    @property
    def finite(self) -> bool:
        """Every float value finite."""
        return all(np.all(np.isfinite(value)) for value in self.values
                   if np.issubdtype(value.dtype, np.floating))

    @property
    def nbytes(self) -> int:
        return sum(value.nbytes for value in self.values)

    def put_back(self, variables: list) -> None:
        """Assign the copies to ``variables``, in order (the same variables, or those of the same
        state listed again)."""
        for variable, value in zip(variables, self.values):
            variable.assign(value)
