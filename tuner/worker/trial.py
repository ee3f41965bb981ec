"""Run one trial: apply a config, build the user's model, train a fixed budget, record.

``run_trial(spec_dict) -> result_dict``: plain data in and out, so it runs unchanged in this
process, a subprocess or a Ray actor. Failures inside the trial become a result, not an
exception: the search must go on.
"""

from __future__ import annotations

import gc
import math
import os
import socket
import statistics
import threading
import time

from tuner.config import PrecisionConfig
from tuner.errors import TaskError
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec

# A step this much slower than the early-stop threshold ends the trial even during warm-up.
_HOPELESS_FACTOR = 5.0
_MIN_TIMED_STEPS_FOR_STOP = 3


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
    memory = _MemoryMeter()
    try:
        from tuner.worker.task_loader import fixed_batches, load_task, task_file_here

        reset_keras_state(spec.seed)
        task = load_task(task_file_here(spec.task_path, spec.task_source))
        batches = fixed_batches(task, spec.steps)
        config = PrecisionConfig.from_dict(spec.config)
        memory.start()
        with config.scope():
            model = task.build_model()
            stage = "compile"
            optimizer = config.wrap_optimizer(task.optimizer())
            model.compile(optimizer=optimizer, loss=task.loss, metrics=task.metrics,
                          **config.compile_kwargs())
            result.batch_size = _batch_size(batches[0][0])
            stage = "train"
            result.setup_s = time.perf_counter() - started
            _train(model, model.optimizer, batches, spec, result)
        result.weights_bytes = sum(int(w.numpy().nbytes) for w in model.weights)
        if result.first_non_finite_step is not None:
            result.failure_layer = _locate_divergence(task, config, batches, spec.seed,
                                                      result.first_non_finite_step)
    except TaskError as exc:
        result = TrialResult.failed(spec.number, FailureClass.TASK_ERROR, str(exc),
                                    warmup_steps=spec.warmup_steps, node=result.node)
    except Exception as exc:  # noqa: BLE001 - every failure becomes part of the result
        failure_class, message, layer = classify(exc, stage="task" if stage == "task" else "train")
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


def _batch_size(x) -> int | None:
    import tensorflow as tf

    leaves = tf.nest.flatten(x)
    return int(leaves[0].shape[0]) if leaves and leaves[0].shape.rank else None


def _train(model, optimizer, batches, spec: TrialSpec, result: TrialResult) -> None:
    from tuner.keras_apply import current_loss_scale

    iterations = int(optimizer.iterations.numpy())
    for step in range(spec.steps):
        x, y, sample_weight = batches[step % len(batches)]
        start = time.perf_counter()
        logs = model.train_on_batch(x, y, sample_weight=sample_weight, return_dict=True)
        if "loss" not in logs:
            raise TaskError("the model's train_step must return a dict with a 'loss' entry. "
                            f"Received keys: {sorted(logs)}. Return {{'loss': loss, ...}}.")
        loss = float(logs["loss"])  # already synchronised: train_on_batch returns host values
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        result.losses.append(loss)
        result.step_times_ms.append(elapsed_ms)
        if step == 0:  # Keras traces (and may compile) the training step on its first call
            result.trace_s = elapsed_ms / 1000.0
        else:
            result.train_s += elapsed_ms / 1000.0
        result.loss_scales.append(current_loss_scale(optimizer))
        now = int(optimizer.iterations.numpy())
        if now == iterations:  # a LossScaleOptimizer skipped the update (non-finite grads)
            result.skipped_steps += 1
        iterations = now
        if not math.isfinite(loss):
            result.first_non_finite_step = step
            result.outcome = TrialOutcome.DIVERGED
            return
        reason = _too_slow_reason(result, spec, step, elapsed_ms)
        if reason:
            result.outcome = TrialOutcome.STOPPED_SLOW
            result.stop_reason = reason
            return


_MAX_REPLAY_STEPS = 50


def _locate_divergence(task, config: PrecisionConfig, batches, seed: int, step: int) -> str | None:
    """Name the first layer whose output was non-finite at the step where the loss was.

    The diverged model's weights are already damaged by that step's update, so the trial is
    replayed (same seed, same batches: deterministic) up to just before that step, and the
    forward pass of that step is run with every layer's output checked.
    """
    if step > _MAX_REPLAY_STEPS:
        return None
    reset_keras_state(seed)
    with config.scope():
        model = task.build_model()
        model.compile(optimizer=config.wrap_optimizer(task.optimizer()), loss=task.loss,
                      **config.compile_kwargs())
        for index in range(step):
            x, y, sample_weight = batches[index % len(batches)]
            model.train_on_batch(x, y, sample_weight=sample_weight)
        return first_non_finite_layer(model, batches[step % len(batches)][0])


def first_non_finite_layer(model, x) -> str | None:
    """Run the forward pass eagerly and name the first layer whose output is not finite."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tuner.keras_apply import hook_layer_calls

    found: list[str] = []

    def check(layer, output) -> None:
        if found or isinstance(layer, keras.Model):
            return
        for tensor in tf.nest.flatten(output):
            if getattr(tensor, "dtype", None) is not None and tensor.dtype.is_floating \
                    and not np.all(np.isfinite(keras.ops.convert_to_numpy(tensor))):
                found.append(layer.path or layer.name)
                return

    with hook_layer_calls(after=check):
        try:
            model(x, training=True)
        except Exception:  # noqa: BLE001 - naming the layer is a courtesy; never fail on it
            pass
    return found[0] if found else None


def _too_slow_reason(result: TrialResult, spec: TrialSpec, step: int, elapsed_ms: float) -> str:
    limit = spec.stop_if_slower_than_ms
    if limit is None:
        return ""
    if step >= 1 and elapsed_ms > _HOPELESS_FACTOR * limit:
        # Even a warm-up step this slow cannot end up fast enough.
        return (f"stopped at step {step}: {elapsed_ms:.1f} ms/step, over {_HOPELESS_FACTOR:g}x "
                f"the limit of {limit:.1f} ms")
    timed = result.timed_steps_ms
    if len(timed) >= _MIN_TIMED_STEPS_FOR_STOP and statistics.median(timed) > limit:
        return (f"stopped after {step + 1} steps: median {statistics.median(timed):.1f} ms/step "
                f"> limit {limit:.1f} ms (the early-stop limit)")
    return ""


class _MemoryMeter:
    """Peak memory of the trial: the GPU allocator's peak, else host RSS growth (sampled)."""

    def __init__(self) -> None:
        self._gpu = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._baseline = 0
        self._peak = 0

    def start(self) -> None:
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            self._gpu = gpus[0].name.replace("/device:", "")
            tf.config.experimental.reset_memory_stats(self._gpu)
            return
        self._baseline = self._peak = _rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self._peak = max(self._peak, _rss_bytes())

    def stop(self) -> tuple[int | None, str]:
        if self._gpu is not None:
            import tensorflow as tf

            return int(tf.config.experimental.get_memory_info(self._gpu)["peak"]), "gpu_peak"
        if self._thread is None:
            return None, ""
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, _rss_bytes())
        return self._peak - self._baseline, "host_rss_growth"


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: fall back to the lifetime peak
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def probe_task(task_path: str, steps: int) -> dict:
    """Check the task in the worker before anything is written; return a short description.

    Raises TaskError (a UsageError) when the task breaks the contract.
    """
    import keras

    from tuner.worker.task_loader import fixed_batches, load_task

    reset_keras_state(0)
    task = load_task(task_path)
    batches = fixed_batches(task, steps)
    try:
        model = task.build_model()
    except Exception as exc:
        raise TaskError(f"build_model() in {task.path.name} raised {type(exc).__name__}: "
                        f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}. "
                        "Fix the task file.") from exc
    if not isinstance(model, keras.Model):
        raise TaskError(f"build_model() in {task.path.name} must return a keras.Model. "
                        f"Received: {type(model).__name__}")
    style = ("sequential" if isinstance(model, keras.Sequential) else
             "functional" if type(model).__name__ == "Functional" else "subclassed")
    import tensorflow as tf

    info = {"tensorflow": tf.__version__, "keras": keras.__version__, "model": model.name, "style": style, "batches": len(batches),
            "batch_size": _batch_size(batches[0][0]),
            "parameters": int(sum(int(math.prod(w.shape)) for w in model.weights))
            if model.built else None}
    reset_keras_state(0)
    return info
