"""Run one trial: apply a config, build the user's model, train a fixed budget, record.

``run_trial(spec_dict) -> result_dict``: plain data in and out, so it runs unchanged in this
process, a subprocess or a Ray actor. Failures inside the trial become a result, not an
exception: the search must go on.
"""

from __future__ import annotations

import gc
import math
import socket
import statistics
import time

from tuner.config import PrecisionConfig
from tuner.errors import TaskError
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec
from tuner.worker.memory import MemoryMeter

# Early stopping (see _too_slow_reason): warm-up steps never count; after warm-up, a trial is
# stopped when its last _HOPELESS_STEPS steps were all over _HOPELESS_FACTOR x the limit (float16
# on a CPU without it runs 10-100x slower), or when, over at least _MIN_TIMED_STEPS_FOR_STOP (or
# half the timed budget), even its lower quartile is _CLEAR_MARGIN beyond the limit. One hiccup
# cannot do either; a near-miss runs to the end and is judged like any other trial.
_HOPELESS_FACTOR = 3.0
_HOPELESS_STEPS = 3
_MIN_TIMED_STEPS_FOR_STOP = 6
_CLEAR_MARGIN = 1.1


def reset_keras_state(seed: int) -> None:
    """Undo everything a previous trial may have left behind in this process."""
    import keras

    keras.backend.clear_session()
    keras.config.set_dtype_policy("float32")
    keras.config.set_floatx("float32")
    keras.config.set_epsilon(1e-7)
    keras.utils.set_random_seed(seed)
    gc.collect()


def run_trial(spec_dict: dict) -> dict:
    spec = TrialSpec.from_dict(spec_dict)
    return _run(spec).to_dict()


def _run(spec: TrialSpec) -> TrialResult:
    from tuner.worker.failures import classify

    started = time.perf_counter()
    result = TrialResult(number=spec.number, outcome=TrialOutcome.COMPLETED,
                         warmup_steps=spec.warmup_steps, node=socket.gethostname())
    stage = "task"
    memory = MemoryMeter()
    model = optimizer = None
    try:
        from tuner.worker.task_loader import fixed_batches, load_task, task_file_here

        reset_keras_state(spec.seed)
        task = load_task(task_file_here(spec.task_path, spec.task_source))
        batches = fixed_batches(task, spec.batch_pool or spec.steps)
        config = PrecisionConfig.from_dict(spec.config)
        memory.start()
        with config.scope():
            model = task.build_model()
            stage = "check"
            rounding = _input_rounding(model, batches[0], spec)
            if rounding is not None:
                failure_class, layer, reason = rounding
                result = TrialResult.failed(spec.number, failure_class, reason, layer,
                                            warmup_steps=spec.warmup_steps, node=result.node)
                return result
            stage = "compile"
            optimizer = _compile(model, task, config)
            result.batch_size = batch_size_of(batches[0][0])
            stage = "train"
            result.setup_s = time.perf_counter() - started
            _train(model, optimizer, batches, spec, result)
            if spec.validate and result.outcome is TrialOutcome.COMPLETED:
                result.validation = validate(task, model, spec)
        result.weights_bytes = sum(int(w.numpy().nbytes) for w in model.weights)
        result.training_memory = _training_memory(model, optimizer, batches[0], config)
        if spec.keep_live and result.outcome is TrialOutcome.COMPLETED:
            from tuner.worker.live import keep

            keep(spec, model, optimizer, batches, task, trained=len(result.losses))
        if result.first_non_finite_step is not None:
            result.failure_layer = _locate_divergence(task, config, batches, spec.seed,
                                                      result.first_non_finite_step)
    except TaskError as exc:
        result = TrialResult.failed(spec.number, FailureClass.TASK_ERROR, str(exc),
                                    warmup_steps=spec.warmup_steps, node=result.node)
    except Exception as exc:  # noqa: BLE001 - every failure becomes part of the result
        paths, loss_layers = _failure_context(model)
        failure_class, message, layer = classify(exc, stage="task" if stage == "task" else "train",
                                                 layer_paths=paths, loss_layers=loss_layers)
        partial = result
        result = TrialResult.failed(spec.number, failure_class, message, layer,
                                    warmup_steps=spec.warmup_steps, node=partial.node,
                                    losses=partial.losses, step_times_ms=partial.step_times_ms,
                                    loss_scales=partial.loss_scales, setup_s=partial.setup_s,
                                    trace_s=partial.trace_s, train_s=partial.train_s)
    finally:
        peak, source = memory.stop()
        result.peak_memory_bytes, result.memory_source = peak, source
        result.wall_s = time.perf_counter() - started
        model = optimizer = None  # noqa: F841 - release before the next trial
        gc.collect()
    return result


def validate(task, model, spec: TrialSpec) -> dict:
    """The model's loss and metrics on the run's validation batches (tuner.worker.validation)."""
    from tuner.worker.task_loader import validation_batches
    from tuner.worker.validation import evaluate

    batches, source = validation_batches(task, spec.batch_pool or spec.steps)
    return evaluate(model, batches, source)


def _training_memory(model, optimizer, first_batch, config: PrecisionConfig) -> dict | None:
    """Exact training-state and activation bytes (tuner.worker.memory); None if the model
    cannot be run eagerly once more (the figure is a courtesy, never a failure)."""
    import keras

    from tuner.worker.memory import training_memory

    x, _, _ = keras.utils.unpack_x_y_sample_weight(first_batch)
    try:
        with config.scope():
            return training_memory(model, optimizer, x)
    except Exception:  # noqa: BLE001
        return None


def _input_rounding(model, first_batch,
                    spec: TrialSpec) -> tuple[FailureClass, str, str] | None:
    """(failure class, layer, reason) when this config rounds the integer-valued floats a layer
    takes, or erases a continuous feature it takes (both found by the diagnostics), in one
    forward pass."""
    from tuner.worker.continuous_inputs import continuous_check
    from tuner.worker.integer_inputs import first_rounding, integer_check

    checks = {}
    if spec.integer_inputs:
        checks[FailureClass.INTEGER_ROUNDING] = integer_check(spec.integer_inputs)
    if spec.continuous_inputs:
        checks[FailureClass.INPUT_ROUNDING] = continuous_check(spec.continuous_inputs)
    if not checks:
        return None
    import keras

    x, _, _ = keras.utils.unpack_x_y_sample_weight(first_batch)
    return first_rounding(model, x, checks)


def _failure_context(model) -> tuple[list[str], list[str]]:
    """What ``classify`` needs from the model, in one walk of its layers: every layer's path,
    and the layers whose last call added a loss term that is not float32 (``add_loss``)."""
    if model is None:
        return [], []
    from tuner.keras_apply import layer_paths

    try:
        pairs = layer_paths(model)
    except Exception:  # noqa: BLE001 - naming the layer is a courtesy; never fail on it
        return [], []
    loss_layers = [path for layer, path in pairs
                   if any(getattr(term, "dtype", "float32") not in ("float32", "float64")
                          for term in getattr(layer, "_losses", []))]
    return [path for _, path in pairs], loss_layers


def batch_size_of(x) -> int | None:
    import tensorflow as tf

    leaves = tf.nest.flatten(x)
    return int(leaves[0].shape[0]) if leaves and leaves[0].shape.rank else None


def _compile(model, task, config: PrecisionConfig):
    """Compile as the user's training script would with this config; returns the optimizer."""
    optimizer = config.wrap_optimizer(task.optimizer())
    model.compile(optimizer=optimizer, loss=task.loss, metrics=task.metrics,
                  **config.compile_kwargs())
    return optimizer


def _fit_steps(model, batches, steps: int, callbacks=()) -> None:
    """Train up to ``steps`` steps with ``model.fit`` itself, on ``batches`` in order (cycled).

    ``fit`` hands ``train_step`` each batch in the structure the task's data has (``(x, y)``
    or ``(x, y, sample_weight)``) and runs its compiled train function per step, in one epoch
    (an epoch per step cost 5-6 ms of ``fit``'s own bookkeeping per step here, half a small
    model's step). A callback may stop it early (``model.stop_training``).
    """
    if steps > 0:
        model.fit(_batch_dataset(batches, steps), epochs=1, steps_per_epoch=steps,
                  shuffle=False, verbose=0, callbacks=list(callbacks))


# The batches stacked into one tensor per leaf, per list of batches (the worker's cached
# ``fixed_batches``): stacking them again for every run cost a live model's re-measurement run
# more than its bookkeeping.
_STACKED: dict[int, tuple[list, object]] = {}


def _batch_dataset(batches, steps: int):
    import tensorflow as tf

    # tf.data reads a Python list as one tensor; a list of model inputs is a tuple to it.
    def tuples(structure):
        if isinstance(structure, (list, tuple)):
            return tuple(tuples(part) for part in structure)
        if isinstance(structure, dict):
            return {key: tuples(value) for key, value in structure.items()}
        return structure

    kept = _STACKED.get(id(batches))
    if kept is None or kept[0] is not batches:
        stacked = tf.nest.map_structure(lambda *parts: tf.stack(parts),
                                        *[tuples(batch) for batch in batches])
        kept = _STACKED[id(batches)] = (batches, stacked)
    # Without tf.data's autotuning (nothing here to tune: the batches are in memory): its
    # thread held ``fit`` 0.2-0.55 s past the last step of one run in two, as it shut down.
    options = tf.data.Options()
    options.autotune.enabled = False
    return tf.data.Dataset.from_tensor_slices(kept[1]).repeat().take(steps).with_options(options)


def _step_recorder(optimizer, spec: TrialSpec, result: TrialResult, traces: bool = True):
    """A callback that times each of ``fit``'s steps and records what the step did.
    ``traces``: the first step traces the training step (a model that trained before has it).

    The clock runs from ``on_train_batch_begin`` to ``on_train_batch_end``: ``fit``'s train
    function and its conversion of the step's logs to Python numbers, which waits for the step
    to finish (so the time is the step's, not the time to queue it). Everything recorded here
    (loss scale, optimizer iterations) is read outside that window. The model's metrics are
    reset before each step, as ``fit`` does at an epoch's start, so the logged loss is that
    step's loss and not a running mean. A sized run (``spec.sizing``) stops once
    ``tuner.sizing.enough`` says so.
    """
    import keras

    from tuner.loss_scaling import current_loss_scale
    from tuner.sizing import Sizing, enough

    sizing = Sizing.from_dict(spec.sizing) if spec.sizing else None
    scaled = keras.optimizers.LossScaleOptimizer

    class StepRecorder(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            # Only a LossScaleOptimizer (ours, or the one compile wraps around a mixed_float16
            # model's) skips updates; reading the step counter costs a sync per read.
            self.may_skip = isinstance(optimizer, scaled) or \
                isinstance(getattr(self.model, "optimizer", None), scaled)

        def on_train_batch_begin(self, batch, logs=None):
            self.model.reset_metrics()
            if self.may_skip:
                self.iterations = int(optimizer.iterations.numpy())
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            elapsed_ms = (time.perf_counter() - self.started) * 1000.0
            step = len(result.losses)
            logs = logs or {}
            if "loss" not in logs:
                raise TaskError("the model's train_step must return a dict with a 'loss' entry. "
                                f"Received keys: {sorted(logs)}. Return {{'loss': loss, ...}}.")
            loss = float(logs["loss"])
            result.losses.append(loss)
            result.step_times_ms.append(elapsed_ms)
            if step == 0 and traces:  # Keras traces (and may compile) it on its first call
                result.trace_s = elapsed_ms / 1000.0
            else:
                result.train_s += elapsed_ms / 1000.0
            result.loss_scales.append(current_loss_scale(optimizer))
            if self.may_skip and int(optimizer.iterations.numpy()) == self.iterations:
                result.skipped_steps += 1  # the LossScaleOptimizer skipped the update
            if not math.isfinite(loss):
                result.first_non_finite_step = step
                result.outcome = TrialOutcome.DIVERGED
                self.model.stop_training = True
                return
            reason = _too_slow_reason(result, spec, step, elapsed_ms)
            if reason:
                result.outcome = TrialOutcome.STOPPED_SLOW
                result.stop_reason = reason
                self.model.stop_training = True
            elif sizing is not None:
                sized_by = enough(result.losses, result.step_times_ms, spec.warmup_steps,
                                  sizing)
                if sized_by:
                    result.sized_by = sized_by
                    self.model.stop_training = True

    return StepRecorder()


def _train(model, optimizer, batches, spec: TrialSpec, result: TrialResult) -> None:
    steps = spec.steps if spec.sizing is None else spec.sizing["max_steps"]
    _fit_steps(model, batches, steps, [_step_recorder(optimizer, spec, result)])


_MAX_REPLAY_STEPS = 50


def _locate_divergence(task, config: PrecisionConfig, batches, seed: int, step: int) -> str | None:
    """Name the first layer whose output was non-finite at the step where the loss was.

    The diverged model's weights are already damaged by that step's update, so the trial is
    replayed (same seed, same batches, the same ``fit`` steps: deterministic) up to just before
    that step, and the forward pass of that step is run with every layer's output checked.
    """
    import keras

    if step > _MAX_REPLAY_STEPS:
        return None
    reset_keras_state(seed)
    with config.scope():
        model = task.build_model()
        _compile(model, task, config)
        _fit_steps(model, batches, step)
        x, _, _ = keras.utils.unpack_x_y_sample_weight(batches[step % len(batches)])
        return first_non_finite_layer(model, x)


def first_non_finite_layer(model, x) -> str | None:
    """Run the forward pass eagerly and name the first layer whose output is not finite."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tuner.keras_apply import call_path, hook_layer_calls

    found: list[str] = []

    def check(layer, output) -> None:
        if found or isinstance(layer, keras.Model):
            return
        for tensor in tf.nest.flatten(output):
            if getattr(tensor, "dtype", None) is not None and tensor.dtype.is_floating \
                    and not np.all(np.isfinite(keras.ops.convert_to_numpy(tensor))):
                found.append(call_path(layer))
                return

    with hook_layer_calls(after=check):
        try:
            model(x, training=True)
        except Exception:  # noqa: BLE001 - naming the layer is a courtesy; never fail on it
            pass
    return found[0] if found else None


def _too_slow_reason(result: TrialResult, spec: TrialSpec, step: int, elapsed_ms: float) -> str:
    """Why to stop this trial now as clearly slower than the best one so far ("" to go on)."""
    limit = spec.stop_if_slower_than_ms
    timed = result.timed_steps_ms  # empty during warm-up: tracing and first steps never count
    if limit is None or not timed:
        return ""
    recent = timed[-_HOPELESS_STEPS:]
    if len(recent) == _HOPELESS_STEPS and min(recent) > _HOPELESS_FACTOR * limit:
        return (f"stopped at step {step}: the last {_HOPELESS_STEPS} steps all took over "
                f"{_HOPELESS_FACTOR:g}x the limit of {limit:.1f} ms (fastest "
                f"{min(recent):.1f} ms)")
    needed = max(_MIN_TIMED_STEPS_FOR_STOP, (spec.steps - spec.warmup_steps) // 2)
    if len(timed) < needed:
        return ""
    quartile = sorted(timed)[len(timed) // 4]
    if quartile > _CLEAR_MARGIN * limit:
        return (f"stopped after {step + 1} steps: even the fastest quarter of its steps took "
                f"over {quartile:.1f} ms, beyond the early-stop limit of {limit:.1f} ms "
                f"(+{_CLEAR_MARGIN - 1:.0%} margin; median {statistics.median(timed):.1f} ms)")
    return ""
