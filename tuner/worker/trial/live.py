"""Models kept alive in a worker, so that the re-measurement builds and traces each config once.

The re-measurement times float32 and the finalists round after round. Rebuilding and retracing
a model for every round spent more time than the rounds' training steps, so a worker keeps each
config's compiled model (with its optimizer and batches) here, keyed by the task and the config:
``run_live(spec)`` builds, traces and trains it on first use (a whole trial, as ``run_trial``)
and on every later use trains ``spec.steps`` more steps of the same live model, timing each (or,
for the confirmation, until the model has trained ``spec.train_to`` steps in all, then evaluates
it on the validation batches: ``spec.validate``). The
float32 baseline trial (``spec.keep_live``) leaves its model here, so a re-measurement in the
same worker starts from it. ``release()`` drops them all. Per process: a fresh worker (after a
crash, or one that replaced a worker without room: tuner.run.kept_models) starts empty and
builds again.
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace

from tuner.apply.config import PrecisionConfig
from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec
from tuner.worker.device.tf32 import hold_float32
from tuner.worker.trial.error_reading import classify
from tuner.worker.trial.live_models import LIVE, LiveModel, key_of
from tuner.worker.trial.steps import fit_steps, step_recorder
from tuner.worker.trial.trial import train_trial
from tuner.worker.trial.validation import validate


def run_live(spec_dict: dict) -> dict:
    """One timing run of ``spec``'s config on its live model (built and traced on first use)."""
    spec = TrialSpec.from_dict(spec_dict)
    hold_float32(spec.strict_float32)
    live = LIVE.get(key_of(spec))
    if live is None:
        # Built here (a fresh worker): a whole trial of ``spec.steps`` first.
        built = train_trial(replace(spec, keep_live=True, train_to=None,
                             validate=spec.validate and spec.train_to is None))
        live = LIVE.get(key_of(spec))
        if spec.train_to is None or live is None:
            built.trained_steps = len(built.losses)
            return built.to_dict()
    return _continue(live, spec).to_dict()


def _continue(live: LiveModel, spec: TrialSpec) -> TrialResult:

    started = time.perf_counter()
    result = TrialResult(number=spec.number, outcome=TrialOutcome.COMPLETED,
                         warmup_steps=spec.warmup_steps, node=socket.gethostname())
    steps = spec.steps if spec.train_to is None else max(0, spec.train_to - live.trained)
    try:
        recorder = step_recorder(live.optimizers, spec, result, traces=False)
        fit_steps(live.model, live.batches, steps, [recorder])
        live.trained += len(result.losses)
        if spec.validate and result.outcome is TrialOutcome.COMPLETED:
            result.validation = _validate(live, spec)
    except Exception as exc:  # noqa: BLE001 - a failure is this run's result
        failure_class, message, layer = classify(exc, stage="train")
        result = TrialResult.failed(spec.number, failure_class, message, layer,
                                    warmup_steps=spec.warmup_steps, node=result.node,
                                    losses=result.losses, step_times_ms=result.step_times_ms)
    if result.outcome is not TrialOutcome.COMPLETED:
        LIVE.pop(key_of(spec), None)  # a diverged or failed model is not timed again
    result.trained_steps = live.trained
    result.wall_s = time.perf_counter() - started
    return result


def _validate(live: LiveModel, spec: TrialSpec) -> dict:
    if live.task is None:
        return {"error": "the live model was kept without its task", "source": "none"}
    # In the config's scope: Keras reads the epsilon when it traces the evaluation step.
    with PrecisionConfig.from_dict(spec.config).scope():
        return validate(live.task, live.model, spec.batch_pool or spec.steps)
