"""Evaluate a trained model on the run's fixed validation batches, batch by batch.

Every trial ends with this evaluation (``TrialSpec.validate``), and the confirmation run
evaluates float32 and the pick at several points of their longer training. The evaluation is
``model.evaluate`` itself, so a custom ``test_step`` and the data's own structure work as under
``fit(validation_data=...)``; the model's metrics are reset before each batch, so each batch's
logs are that batch's values, not a running mean. Per-batch values give the validation noise:
trials see the same batches, so the verdict compares them batch by batch (tuner.judging.verdict).

Plain data out: ``{"loss", "batch_losses", "metrics", "batches", "samples", "source",
"seconds"}``, or ``{"error": ...}`` when the model cannot be evaluated; with the task's
``val_metric(model)``, its value too (``"val_metric"`` and, given per batch,
``"val_metric_values"``; or ``"val_metric_error"``). Where float32's validation ran, a trial
whose validation fails has failed that check (``tuner.judging.verdict.validation_failure``);
where float32's fails too, no config can be compared on validation, the trials are judged on
their training losses, and the summary says why.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from tuner.errors import first_line
from tuner.worker.task.task_model import has_forward_pass
from tuner.worker.trial.steps import batch_dataset


def validate(task, model, pool: int) -> dict[str, Any]:
    """The model's loss and metrics on the validation batches of a run whose trials cycle
    ``pool`` training batches (tuner.worker.task.task_loader.validation_batches)."""
    from tuner.worker.task.task_loader import validation_batches  # numpy at import

    batches, source = validation_batches(task, pool)
    result = evaluate(model, batches, source) if evaluable(model) else {
        "error": f"{type(model).__name__} has no call() and no test_step(), so it cannot be "
                 "evaluated (define val_metric(model) in the task file to judge it on "
                 "validation)", "source": source}
    if task.val_metric is not None:
        result.update(val_metric(task, model))
    return result


def evaluable(model) -> bool:
    """``model.evaluate`` can run: the model has a forward pass or a ``test_step`` of its own."""
    import keras

    return has_forward_pass(model) or type(model).test_step is not keras.Model.test_step


def val_metric(task, model) -> dict[str, Any]:
    """The task's ``val_metric(model)``, lower is better (a GAN's sample-quality proxy), judged
    against float32's (tuner.judging.verdict.metric_gap): a number, or one per batch of samples
    (their mean is the value, their scatter its noise); or why it failed."""
    try:
        value = task.val_metric(model)
        values = [float(v) for v in value] if hasattr(value, "__len__") else [float(value)]
        if not values:
            raise ValueError("it returned no value")
    except Exception as exc:  # noqa: BLE001 - a failed check is judged, not raised
        return {"val_metric_error": f"val_metric(model) raised {type(exc).__name__}: "
                                    f"{first_line(exc, 200)}"}
    return {"val_metric": statistics.fmean(values),
            **({"val_metric_values": values} if len(values) > 1 else {})}


def evaluate(model, batches: list, source: str) -> dict[str, Any]:
    import keras

    if not batches:
        return {"error": "no validation data: the training data is too small to hold back "
                         "a slice (define val_data() in the task file)", "source": "none"}
    per_batch: list[dict[str, float]] = []
    # The first batch traces (and may compile) the model's test step where evaluate has not
    # made its function before: tracing, as the first training step is, not validation.
    first_batch = {"traces": getattr(model, "test_function", None) is None, "seconds": 0.0}

    class PerBatch(keras.callbacks.Callback):
        def on_test_batch_begin(self, batch, logs=None):
            self.model.reset_metrics()
            self.started = time.perf_counter()

        def on_test_batch_end(self, batch, logs=None):
            per_batch.append(_scalars(logs or {}))
            if batch == 0 and first_batch["traces"]:
                first_batch["seconds"] = time.perf_counter() - self.started

    started = time.perf_counter()
    try:
        model.evaluate(batch_dataset(batches, len(batches)), steps=len(batches), verbose=0,
                       callbacks=[PerBatch()])
    except Exception as exc:  # noqa: BLE001 - validation is a courtesy the trial survives
        return {"error": f"model.evaluate raised {type(exc).__name__}: {first_line(exc, 200)}",
                "source": source}
    seconds = time.perf_counter() - started
    losses = [values.get("loss", math.nan) for values in per_batch]
    if len(losses) >= 2 and max(losses) - min(losses) <= 1e-12 * max(1.0, abs(losses[0])):
        # Real losses differ from batch to batch; the same number on each (0, typically) is a
        # test_step that never computes the loss (a `metrics` property that hides Keras's).
        return {"error": f"model.evaluate reports the same loss ({losses[0]:g}) on every "
                         "validation batch: the model's test_step does not compute it (define "
                         "test_step, or keep Keras's loss tracker in `metrics`)",
                "source": source}
    names = sorted({name for values in per_batch for name in values} - {"loss"})
    metrics = {name: statistics.fmean(values[name] for values in per_batch if name in values)
               for name in names}
    first = keras.utils.unpack_x_y_sample_weight(batches[0])[0]
    import tensorflow as tf

    leaves = tf.nest.flatten(first)
    size = int(leaves[0].shape[0]) if leaves and leaves[0].shape.rank else 1
    return {"loss": statistics.fmean(losses) if losses else math.nan, "batch_losses": losses,
            "metrics": metrics, "batches": len(batches), "samples": size * len(batches),
            "source": source, "seconds": seconds, "trace_seconds": first_batch["seconds"]}


def _scalars(logs: dict) -> dict[str, float]:
    values = {}
    for name, value in logs.items():
        try:
            values[name] = float(value)
        except (TypeError, ValueError):  # a non-scalar metric (a confusion matrix): not shown
            continue
    return values
