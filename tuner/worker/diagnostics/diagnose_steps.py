"""Diagnostics of a model the task compiles itself (``compile_model``): read from its own
training steps.

Such a model (a GAN, a model with two optimizers) computes its losses and gradients inside its
``train_step``, with tapes and optimizers of its own, so there is no single compiled loss to
differentiate from outside. The diagnostics instead run that ``train_step`` eagerly
(tuner.worker.task.task_model.watch_step), a few steps, float32, watching:

- every layer call, of every sub-model (the generator on its latent batch, the discriminator on
  real and generated images, a gradient penalty's interpolates), on exactly what the
  ``train_step`` feeds it: the output ranges, and the input checks on what the data feeds (a
  call whose inputs are all other layers' outputs is left out: a fresh generator's images,
  nearly constant, are not a feature of the data that 16-bit rounding would erase);
- every gradient the ``train_step`` hands an optimizer (its ``apply``, which
  ``apply_gradients`` calls): the weight gradients, by layer, from which the loss scale is
  recommended.

What it cannot read is the gradient of a loss with respect to each layer's output (no tape
reaches the ``train_step``'s losses from outside): those entries are ``None``, and a layer's
risk comes from its activations.
"""

from __future__ import annotations

from typing import Any

from tuner.worker.diagnostics.layer_ranges import diagnostics_from, record_step
from tuner.worker.diagnostics.layer_watch import LayerWatch
from tuner.worker.task.task_model import compile_by_task, watch_step


def diagnose_by_steps(task, model, batches: list, steps: int) -> dict[str, Any]:
    """Diagnostics (``layer_ranges``' shape) from ``steps`` watched training steps of ``model``,
    compiled by the task's ``compile_model`` with gradient-recording optimizers."""
    from tuner.apply.keras_internals import optimizer_trainable_variables
    from tuner.apply.layers import hook_layer_calls

    applied: list[tuple[Any, Any]] = []   # (variable, gradient) as the optimizers received them

    def recording(optimizer):
        apply = optimizer.apply

        def apply_and_record(grads, trainable_variables=None):
            variables = trainable_variables if trainable_variables is not None \
                else optimizer_trainable_variables(optimizer)
            applied.extend(zip(variables, grads))
            return apply(grads, trainable_variables)

        optimizer.apply = apply_and_record
        return optimizer

    compile_by_task(model, task, recording)
    records: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    watch = LayerWatch(data_only=True)
    for step in range(steps):
        watch.captured.clear()
        watch.produced.clear()
        applied.clear()
        with hook_layer_calls(before=watch.inputs, after=watch.capture):
            watch_step(model, batches[step % len(batches)])
        pairs = [(variable, grad) for variable, grad in applied if grad is not None]
        record_step(records, order, watch.captured, [None] * len(watch.captured),
                     [variable for variable, _ in pairs], [grad for _, grad in pairs])
    found = watch.findings()
    found["output_heads"] = []   # no forward pass: no outputs paired with targets
    return diagnostics_from(task, steps, [records[name] for name in order], found)
