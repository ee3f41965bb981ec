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
crash) starts empty and builds again.
"""

from __future__ import annotations

import gc
import json
import socket
import time
from dataclasses import dataclass, replace
from typing import Any

from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec


@dataclass
class _Live:
    model: Any
    optimizer: Any
    batches: list
    task: Any = None
    trained: int = 0          # steps this model has trained in all


_LIVE: dict[str, _Live] = {}


def _key(spec: TrialSpec) -> str:
    return json.dumps([spec.task_path, spec.config, spec.seed], sort_keys=True)


def keep(spec: TrialSpec, model, optimizer, batches, task=None, trained: int = 0) -> None:
    _LIVE[_key(spec)] = _Live(model, optimizer, batches, task, trained)


def keep_only(spec_dicts: list[dict]) -> int:
    """Drop every live model but those of these specs' configs; returns how many are left."""
    wanted = {_key(TrialSpec.from_dict(spec)) for spec in spec_dicts}
    for key in [key for key in _LIVE if key not in wanted]:
        del _LIVE[key]
    gc.collect()
    return len(_LIVE)


def release() -> int:
    """Drop every live model; returns how many there were."""
    count = len(_LIVE)
    _LIVE.clear()
    gc.collect()
    return count


def run_live(spec_dict: dict) -> dict:
    """One timing run of ``spec``'s config on its live model (built and traced on first use)."""
    from tuner.worker.trial import _run

    spec = TrialSpec.from_dict(spec_dict)
    live = _LIVE.get(_key(spec))
    if live is None:
        # Built here (a fresh worker): a whole trial of ``spec.steps`` first.
        built = _run(replace(spec, keep_live=True, train_to=None,
                             validate=spec.validate and spec.train_to is None))
        live = _LIVE.get(_key(spec))
        if spec.train_to is None or live is None:
            built.trained_steps = len(built.losses)
            return built.to_dict()
    return _continue(live, spec).to_dict()


def _continue(live: _Live, spec: TrialSpec) -> TrialResult:
    from tuner.worker.failures import classify
    from tuner.worker.trial import _fit_steps, _step_recorder

    started = time.perf_counter()
    result = TrialResult(number=spec.number, outcome=TrialOutcome.COMPLETED,
                         warmup_steps=spec.warmup_steps, node=socket.gethostname())
    steps = spec.steps if spec.train_to is None else max(0, spec.train_to - live.trained)
    try:
        recorder = _step_recorder(live.optimizer, spec, result, traces=False)
        _fit_steps(live.model, live.batches, steps, [recorder])
        live.trained += len(result.losses)
        if spec.validate and result.outcome is TrialOutcome.COMPLETED:
            result.validation = _validate(live, spec)
    except Exception as exc:  # noqa: BLE001 - a failure is this run's result
        failure_class, message, layer = classify(exc, stage="train")
        result = TrialResult.failed(spec.number, failure_class, message, layer,
                                    warmup_steps=spec.warmup_steps, node=result.node,
                                    losses=result.losses, step_times_ms=result.step_times_ms)
    if result.outcome is not TrialOutcome.COMPLETED:
        _LIVE.pop(_key(spec), None)  # a diverged or failed model is not timed again
    result.trained_steps = live.trained
    result.wall_s = time.perf_counter() - started
    return result


def _validate(live: _Live, spec: TrialSpec) -> dict:
    from tuner.config import PrecisionConfig
    from tuner.worker.trial import validate

    if live.task is None:
        return {"error": "the live model was kept without its task", "source": "none"}
    # In the config's scope: Keras reads the epsilon when it traces the evaluation step.
    with PrecisionConfig.from_dict(spec.config).scope():
        return validate(live.task, live.model, spec)
