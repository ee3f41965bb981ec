"""What the diagnostics read from layer calls besides gradients (``LayerWatch``): the float
inputs 16-bit rounding corrupts (``integer_inputs``, ``continuous_inputs``), every layer call's
float output, and the targets each output must produce (``output_targets``).
``forward_findings`` takes these on forward passes alone: where gradients cannot be traced (no
compiled loss), the input and target checks still can.
"""

from __future__ import annotations

from typing import Any

from tuner.worker.diagnostics.continuous_inputs import ContinuousInputs
from tuner.worker.diagnostics.integer_inputs import integer_inputs_of
from tuner.worker.diagnostics.output_targets import OutputTargets


class LayerWatch:
    """What the diagnostics read from layer calls besides gradients: integer-valued and
    continuous float inputs, every layer call's float output (``captured``: path, layer,
    tensor), and each output's targets."""

    def __init__(self, data_only: bool = False) -> None:
        self.integer_inputs: dict[str, dict[str, Any]] = {}
        self.continuous = ContinuousInputs()
        self.targets = OutputTargets()
        self.captured: list[tuple[str, Any, Any]] = []
        # data_only: the input checks skip a call whose float inputs are all other layers'
        # outputs (a watched train_step: a fresh generator's near-constant images are not a
        # feature of the data). ``produced`` holds this step's outputs, keeping their ids valid.
        self.data_only = data_only
        self.produced: list[Any] = []

    def inputs(self, layer, args, kwargs) -> None:
        from tuner.apply.layers import call_path
        from tuner.worker.diagnostics.integer_inputs import float_leaves

        if self.data_only:
            made = {id(tensor) for tensor in self.produced}
            leaves = list(float_leaves(args, kwargs))
            if leaves and all(id(leaf) in made for leaf in leaves):
                return
        path = call_path(layer)
        integer_inputs_of(layer, path, args, kwargs, self.integer_inputs)
        self.continuous.observe(layer, path, args, kwargs)

    def capture(self, layer, output) -> None:
        import tensorflow as tf

        from tuner.apply.instruments import layer_outputs

        if self.data_only:
            self.produced.extend(tf.nest.flatten(output))
        self.captured.extend(layer_outputs(layer, output))

    def findings(self) -> dict[str, list]:
        return {"integer_inputs": list(self.integer_inputs.values()),
                **self.continuous.findings(),
                "output_heads": self.targets.entries()}


def forward_findings(model, batches: list, steps: int) -> dict[str, list]:
    """The input and target checks alone, on ``steps`` forward passes (no loss, no gradient):
    what the diagnostics keep where gradients cannot be traced."""
    import keras

    from tuner.apply.layers import hook_layer_calls

    watch = LayerWatch()
    for step in range(steps):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(batches[step % len(batches)])
        watch.captured.clear()
        with hook_layer_calls(before=watch.inputs, after=watch.capture):
            prediction = model(x, training=False)
        watch.targets.observe(prediction, y, watch.captured)
    return watch.findings()
