"""Run one trial: apply a config, build the user's model, train a fixed budget, record.

``run_trial(spec_dict) -> result_dict``: plain data in and out, so it runs unchanged in this
process, a subprocess or a Ray actor. Failures inside the trial become a result, not an
exception: the search must go on.
"""

from __future__ import annotations

import gc
import socket
import time

from tuner.apply.config import PrecisionConfig
from tuner.apply.reach import activation_share, precision_reach, reached_none, unreached_line
from tuner.errors import TaskError, first_line
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec
from tuner.worker.device.room import device_room
from tuner.worker.device.tf32 import hold_float32
from tuner.worker.task.keras_state import reset_keras_state
from tuner.worker.task.task_model import (
    batch_size_of,
    compile_for_trial,
    has_forward_pass,
    one_pass,
)
from tuner.worker.trial.error_reading import classify_on
from tuner.worker.trial.live_models import keep
from tuner.worker.trial.memory import MemoryMeter, training_memory
from tuner.worker.trial.replay import StartingState, locate_divergence
from tuner.worker.trial.steps import fit_steps, step_recorder
from tuner.worker.trial.validation import validate


def run_trial(spec_dict: dict) -> dict:
    spec = TrialSpec.from_dict(spec_dict)
    hold_float32(spec.strict_float32)
    return train_trial(spec).to_dict()


def train_trial(spec: TrialSpec) -> TrialResult:
    started = time.perf_counter()
    result = TrialResult(number=spec.number, outcome=TrialOutcome.COMPLETED,
                         warmup_steps=spec.warmup_steps, node=socket.gethostname())
    stage = "task"
    memory = MemoryMeter()
    model = optimizers = None
    try:
        from tuner.worker.task.task_loader import fixed_batches, load_task, task_file_here

        reset_keras_state(spec.seed)
        task = load_task(task_file_here(spec.task_path))
        batches = fixed_batches(task, spec.batch_pool or spec.steps)
        config = PrecisionConfig.from_dict(spec.config)
        memory.start()
        with config.scope() as placement:
            model = task.build_model()
            stage = "check"
            if _unreached_yet(result, model, config, placement):  # a built model: no training
                return _unreached(spec, result)
            rounding = _input_rounding(task, model, batches[0], spec)
            if rounding is not None:
                failure_class, layer, reason = rounding
                result = TrialResult.failed(spec.number, failure_class, reason, layer,
                                            warmup_steps=spec.warmup_steps, node=result.node)
                return result
            stage = "compile"
            optimizers = compile_for_trial(model, task, config)
            result.batch_size = batch_size_of(batches[0][0])
            stage = "train"
            result.setup_s = time.perf_counter() - started
            starting = _train(model, optimizers, batches, spec, result)
            if spec.validate and result.outcome is TrialOutcome.COMPLETED:
                result.validation = validate(task, model, spec.batch_pool or spec.steps)
        result.weights_bytes = sum(int(w.numpy().nbytes) for w in model.weights)
        result.training_memory, result.memory_error = _training_memory(model, optimizers,
                                                                       batches[0], config)
        if _unreached_yet(result, model, config, placement):  # a model built by its call
            return _unreached(spec, result)
        if kept := spec.keep_live and result.outcome is TrialOutcome.COMPLETED:
            keep(spec, model, optimizers, batches, task, trained=len(result.losses))
        if result.first_non_finite_step is not None:   # replayed on its own model, unless kept
            result.failure_layer = locate_divergence(
                task, config, batches, spec.seed, result.first_non_finite_step,
                model=None if kept else model, starting=starting, losses=result.losses)
    except TaskError as exc:
        result = TrialResult.failed(spec.number, FailureClass.TASK_ERROR, str(exc),
                                    warmup_steps=spec.warmup_steps, node=result.node)
    except Exception as exc:  # noqa: BLE001 - every failure becomes part of the result
        failure_class, message, layer = classify_on(model, exc,
                                                    stage="task" if stage == "task" else "train")
        result = TrialResult.failed(spec.number, failure_class, message, layer,
                                    warmup_steps=spec.warmup_steps, **_what_it_measured(result))
    finally:
        model = optimizers = None  # noqa: F841 - release before the next trial
        _close(result, memory, started)
    return result


def _close(result: TrialResult, memory: MemoryMeter, started: float) -> None:
    """The trial's memory figures and wall time, once its model is let go: its peak, and
    what the worker has left for the next trial (tuner.run.kept_models decides on it)."""
    peak, source = memory.stop()
    result.peak_memory_bytes, result.memory_source = peak, source
    result.wall_s = time.perf_counter() - started
    gc.collect()
    result.device_room = device_room()


def _unreached_yet(result: TrialResult, model, config: PrecisionConfig, placement) -> bool:
    """Record how much of the model the config's dtype reaches (the activations, once the
    memory record has them); whether it reaches (almost) none."""
    reach = precision_reach(model, config.policy, placement.origin_of)
    reach["activation_share"] = activation_share(result.training_memory, reach["dtype"])
    result.precision_reach = reach
    return reached_none(reach)


def _unreached(spec: TrialSpec, partial: TrialResult) -> TrialResult:
    """The config's 16-bit dtype reached (almost) none of the model: a failure that names the
    layers and the fix (tuner.apply.reach), never a slow 16-bit config."""
    reach = partial.precision_reach
    return TrialResult.failed(spec.number, FailureClass.PRECISION_UNREACHED,
                              unreached_line(reach, PrecisionConfig.from_dict(spec.config).policy),
                              warmup_steps=spec.warmup_steps, precision_reach=reach,
                              training_memory=partial.training_memory,
                              **_what_it_measured(partial))


def _what_it_measured(partial: TrialResult) -> dict:
    """What a trial that failed while training had measured until then."""
    kept = ("node", "losses", "step_times_ms", "loss_scales", "loss_terms", "optimizers",
            "setup_s", "trace_s", "train_s")
    return {name: getattr(partial, name) for name in kept}


def _training_memory(model, optimizers, first_batch,
                     config: PrecisionConfig) -> tuple[dict | None, str]:
    """Exact training-state and activation bytes (tuner.worker.trial.memory), and "" ; or None and
    why the count failed (the model cannot be run eagerly once more, say). A failed count fails
    no trial, but the memory objective cannot rank the config: it says so (by_objective)."""
    try:
        with config.scope():
            return training_memory(model, [o for _, o in optimizers], first_batch), ""
    except Exception as exc:  # noqa: BLE001 - a failed count fails no trial; it says why
        return None, f"{type(exc).__name__}: {first_line(exc, 200)}"


def _input_rounding(task, model, first_batch,
                    spec: TrialSpec) -> tuple[FailureClass, str, str] | None:
    """(failure class, layer, reason) when this config rounds the integer-valued floats a layer
    takes, or erases a continuous feature it takes (both found by the diagnostics), in one
    forward pass; for a model without one, in a training step of a second copy of it (the
    trial's own model must not train a step more than the others)."""
    from tuner.worker.diagnostics.continuous_inputs import continuous_check
    from tuner.worker.diagnostics.integer_inputs import first_rounding, integer_check

    checks = {}
    if spec.integer_inputs:
        checks[FailureClass.INTEGER_ROUNDING] = integer_check(spec.integer_inputs)
    if spec.continuous_inputs:
        checks[FailureClass.INPUT_ROUNDING] = continuous_check(spec.continuous_inputs)
    if not checks:
        return None
    if not has_forward_pass(model):
        model = task.build_model()
        compile_for_trial(model, task, PrecisionConfig.from_dict(spec.config))
    return first_rounding(lambda: one_pass(model, first_batch, training=False), checks)


def _train(model, optimizers, batches, spec: TrialSpec, result: TrialResult) -> StartingState:
    """Train the trial's steps, each recorded; the state the model started in, for a replay to
    where it diverged (tuner.worker.trial.replay)."""
    steps = spec.steps if spec.sizing is None else spec.sizing["max_steps"]
    starting = StartingState()
    fit_steps(model, batches, steps, [starting.callback(), step_recorder(optimizers, spec, result)])
    return starting
