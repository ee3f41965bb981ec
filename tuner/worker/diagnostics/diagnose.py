"""Per-layer numeric ranges from a few instrumented float32 steps.

For every layer call we record the output activations and the loss gradient with respect to
them, and for every layer with weights the weight gradients. Each tensor is summarised by:
its largest magnitude; the fraction of values that would overflow float16 (> 65504); the
fraction of non-zero values that would underflow float16 (flush to zero below 2^-24, or lose
precision as subnormals below 2^-14); and bfloat16's mean relative rounding error.
From these: float32 placement candidates (layers at risk, ranked) and a recommended initial loss
scale. Each gradient also keeps a histogram of its values' binary exponents, so that the share
float16 flushes to zero can be read at any loss scale (``flushed_fraction``): per layer, at
scale 1 and at the recommended scale (``weight_gradient_flushed``), the evidence the mixed
precision paper chose its scales by. Layers that receive float tensors carrying integers beyond
16-bit's exact range (``integer_inputs``, see tuner.worker.diagnostics.integer_inputs), and
layers that receive continuous features that a 16-bit cast erases (``continuous_inputs``: a
large offset, a small spread, see tuner.worker.diagnostics.continuous_inputs), and output layers
whose targets a 16-bit output cannot produce (``output_heads``, see
tuner.worker.diagnostics.output_targets) are candidates ahead of all others. Features float16
rounds to zero that the float32 model cannot use either are recorded apart
(``negligible_inputs``) and name no candidate.
Plain data out (``diagnose_task`` returns a dict). The statistics are
tuner.worker.diagnostics.layer_ranges', what they conclude tuner.judging.layer_risk's; each step
is traced by tuner.apply.instruments.traced_step, or, for a model the task compiles itself, read
from its own ``train_step`` (tuner.worker.diagnostics.diagnose_steps).
"""

from __future__ import annotations

from typing import Any

from tuner.errors import first_line
from tuner.worker.diagnostics.diagnose_steps import diagnose_by_steps
from tuner.worker.diagnostics.layer_ranges import diagnostics_from, record_step, unavailable
from tuner.worker.diagnostics.layer_watch import LayerWatch, forward_findings
from tuner.worker.task.keras_state import reset_keras_state
from tuner.worker.task.task_model import has_forward_pass


def diagnose_task(task_path: str, steps: int = 3, seed: int = 0) -> dict[str, Any]:
    from tuner.worker.task.task_loader import fixed_batches, load_task
    reset_keras_state(seed)
    task = load_task(task_path)
    return diagnostics_or_why(task, task.build_model(), fixed_batches(task, max(steps, 1)),
                              steps)


def diagnostics_or_why(task, model, batches: list, steps: int) -> dict[str, Any]:
    """``diagnose_model``'s diagnostics, or where they cannot be taken on this model, why
    (``unavailable``: the error itself, explained where it is the task's ``LOSS = None``: a
    model that computes its loss in its own ``train_step``, the Keras guide's VAE, has no
    compiled loss to trace gradients of). The input and target checks need no gradients: they
    are still taken, on forward passes. The diagnostics inform the search; the trials still
    judge every config."""
    try:
        if task.compile_model is not None:
            return diagnose_by_steps(task, model, batches, steps)
        return diagnose_model(task, model, batches, steps)
    except Exception as exc:  # noqa: BLE001 - a courtesy to the search, never its end
        error = f"{type(exc).__name__}: {first_line(exc, 200)}"
        why = (f"the task's LOSS is None (its train_step computes the loss), so gradients "
               f"cannot be traced outside it ({error})"
               if task.loss is None and "loss" in str(exc).lower() else error)
    try:
        findings = forward_findings(model, batches, steps) if has_forward_pass(model) else {}
    except Exception as exc:  # noqa: BLE001 - as above
        findings = {}
        why += f"; the input checks failed too ({type(exc).__name__}: {first_line(exc, 200)})"
    return unavailable(task, steps, why, findings)


def diagnose_model(task, model, batches: list, steps: int) -> dict[str, Any]:
    """Diagnostics of a float32 model of ``task`` (built, or to be built on the first batch),
    from ``steps`` instrumented steps on ``batches`` (cycled). It trains the model between
    them (the last step's update, which no step reads, is not applied)."""
    import keras

    from tuner.apply.instruments import traced_step

    model.compile(optimizer=task.optimizer(), loss=task.loss)
    first_x, _, _ = keras.utils.unpack_x_y_sample_weight(batches[0])
    model(first_x, training=False)  # build first: a subclassed model traces symbolically
    records: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    watch = LayerWatch()
    for step in range(steps):
        traced = traced_step(model, batches[step % len(batches)], before=watch.inputs)
        if traced.loss_error is not None:
            raise traced.loss_error
        watch.targets.observe(traced.prediction, traced.y, traced.captured)
        output_grads, weights, weight_grads = traced.gradients()
        record_step(records, order, traced.captured, output_grads, weights, weight_grads)
        if step + 1 < steps:
            model.optimizer.apply(weight_grads, weights)
    return diagnostics_from(task, steps, [records[name] for name in order], watch.findings())
