"""The task check, in the worker: does the task file keep the contract, and what is the model?

Runs before anything is written; raises TaskError (a UsageError, exit 2) when the task breaks
the contract. Also reports which layers each float32 group and pattern selects, so that the
driver can fit the search space to the model.
"""

from __future__ import annotations

import math
from typing import Sequence

from tuner.apply.config import FLOAT32_GROUPS, PrecisionConfig
from tuner.errors import TaskError, describe, first_line
from tuner.task_facts import TaskFacts
from tuner.worker.check.model_files import model_file_failure
from tuner.worker.device.ceiling import largest_kernel, measure_ceiling
from tuner.worker.device.tf32 import facts as tf32_facts
from tuner.worker.task.keras_state import reset_keras_state
from tuner.worker.task.task_model import (
    batch_size_of,
    compile_by_task,
    has_forward_pass,
    watch_step,
)


def optimizer_facts(*optimizers) -> dict:
    """What the search space must fit to in the task's optimizers: their classes, and whether
    each has an ``epsilon`` a config could set (SGD, Lion and Adafactor do not)."""
    return {"class": ", ".join(type(o).__name__ for o in optimizers),
            "epsilon": all(hasattr(o, "epsilon") for o in optimizers)}


def check_task(task_path: str, steps: int, patterns: Sequence[str] = (),
               ceiling: bool = False, diagnose_steps: int = 0) -> dict:
    """Check the task in the worker before anything is written; return a short description.

    The model is built (and, if subclassed, called on the first batch so that its layers exist)
    under a float32 config; the result is a ``tuner.task_facts.TaskFacts`` as a dict: its
    ``float32_matches`` say which layers each float32 group and each of ``patterns`` selects
    (``tuner.apply.scope.float32_matches``), with every layer's path in ``"all_layers"``.
    Raises TaskError (a UsageError) when the task breaks the contract. With ``ceiling``, its
    ``ceiling`` is each precision's speed on this device (``tuner.worker.device.ceiling``),
    timed apart (``ceiling_s``); with ``diagnose_steps``, its ``diagnostics`` are the
    diagnostics of the same model (``tuner.worker.diagnostics.diagnose``: the task is loaded
    and the model built once for both), timed apart too.
    """
    import time

    import keras
    import tensorflow as tf

    from tuner.apply.layers import float32_matches
    from tuner.worker.task.task_loader import fixed_batches, load_task

    started = time.perf_counter()
    reset_keras_state(0)
    task = load_task(task_path)
    batches = fixed_batches(task, steps)
    with PrecisionConfig().scope():
        model, optimizers = _build_checked(task, batches[0])
    style = ("sequential" if isinstance(model, keras.Sequential) else
             "functional" if type(model).__name__ == "Functional" else "subclassed")
    facts = TaskFacts(
        tensorflow=tf.__version__, keras=keras.__version__, model=model.name, style=style,
        batches=len(batches), batch_size=batch_size_of(batches[0][0]),
        parameters=int(sum(int(math.prod(w.shape)) for w in model.weights)),
        float32_matches=float32_matches(model, FLOAT32_GROUPS, tuple(patterns)),
        optimizer=optimizer_facts(*optimizers))
    facts.tf32 = tf32_facts()
    largest = largest_kernel(model, facts.batch_size) if ceiling else None
    facts.probe_s = time.perf_counter() - started  # the job's "task check" phase
    if diagnose_steps:
        started = time.perf_counter()
        from tuner.worker.diagnostics.diagnose import diagnostics_or_why

        facts.diagnostics = diagnostics_or_why(task, model, batches, diagnose_steps)
        facts.diagnostics_s = time.perf_counter() - started
    reset_keras_state(0)
    if ceiling:
        started = time.perf_counter()
        facts.ceiling = measure_ceiling(largest)
        facts.ceiling_s = time.perf_counter() - started
    return facts.to_dict()   # plain data across the process boundary


def _build_checked(task, first_batch) -> tuple:
    """The task's model, built (a subclassed one called on the first batch; one the task
    compiles, or one without ``call()``, trained one watched step), and its optimizers."""
    import keras

    try:
        model = task.build_model()
    except Exception as exc:
        raise TaskError(model_file_failure(exc, task.path.name) or
                        f"build_model() in {task.path.name} raised {type(exc).__name__}: "
                        f"{first_line(exc)}. Fix the task file.") from exc
    if not isinstance(model, keras.Model):
        raise TaskError(f"build_model() in {task.path.name} must return a keras.Model. "
                        f"Received: {describe(model)}. Return the model itself, uncompiled.")
    if task.from_dataset:
        _refuse_unbatched(task, model, first_batch)
    if task.compile_model is not None or not has_forward_pass(model):
        return model, _step_checked(task, model, first_batch)
    if not model.built:  # a subclassed model creates its layers' weights on its first call
        x, _, _ = keras.utils.unpack_x_y_sample_weight(first_batch)
        try:
            model(x)
        except Exception as exc:
            raise TaskError(f"calling the model from build_model() in {task.path.name} on the "
                            f"first batch of train_data() raised {type(exc).__name__}: "
                            f"{first_line(exc)}. Make the model accept train_data()'s x.") \
                from exc
    return model, [task.optimizer()]


def _step_checked(task, model, first_batch) -> list:
    """A model the task compiles itself, or one without ``call()``: compiled (float32) and
    trained one step, watched (tuner.worker.task.task_model), on the first batch; what fails says
    so in one line; its optimizers. Without ``compile_model`` a model without ``call()`` is
    refused: its ``compile()`` is its own (the Keras guide's GAN takes ``d_optimizer,
    g_optimizer``)."""
    name = type(model).__name__
    if task.compile_model is None:
        raise TaskError(f"{name} from build_model() in {task.path.name} defines no call(), so "
                        "it trains through its own train_step and compile(). Define "
                        "compile_model(model, wrap_optimizer) in the task file: compile the "
                        "model there, each optimizer wrapped, e.g. model.compile(d_optimizer="
                        "wrap_optimizer(keras.optimizers.Adam(1e-4)), ...)")
    optimizers = compile_by_task(model, task, lambda optimizer: optimizer)
    try:
        watch_step(model, first_batch)
    except Exception as exc:
        raise TaskError(f"{name}.train_step on the first batch of train_data() in "
                        f"{task.path.name} raised {type(exc).__name__}: {first_line(exc)}. "
                        "Make it train on train_data()'s batches.") from exc
    return [optimizer for _, optimizer in optimizers]


def _refuse_unbatched(task, model, first_batch) -> None:
    """A dataset without ``.batch()`` yields single samples: each x lacks the batch dimension
    the model's inputs have. Only a model with declared inputs can tell (a subclassed model's
    first call on the batch fails instead, and is refused above)."""
    import keras
    import numpy as np
    import tensorflow as tf

    inputs = getattr(model, "inputs", None)
    if not inputs:
        return
    x, _, _ = keras.utils.unpack_x_y_sample_weight(first_batch)
    leaves = tf.nest.flatten(x)
    expected = [tuple(t.shape) for t in tf.nest.flatten(inputs)]
    if len(leaves) == len(expected) and all(np.ndim(leaf) == len(shape) - 1
                                            for leaf, shape in zip(leaves, expected)):
        raise TaskError(f"train_data() in {task.path.name} yields unbatched elements: x of shape "
                        f"{tuple(np.shape(leaves[0]))}, while the model takes "
                        f"{expected[0]}. Call .batch(BATCH_SIZE) on the dataset.")
