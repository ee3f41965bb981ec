"""The models a worker keeps alive between runs, keyed by the task and the config.

A trial that may be re-measured leaves its compiled model (with its optimizer, batches and
task) here (``keep``); tuner.worker.trial.live trains it on in later runs; ``keep_only`` and
``release`` drop what the driver no longer needs. Per process: a fresh worker starts empty.
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from typing import Any

from tuner.trial_types import TrialSpec


@dataclass
class LiveModel:
    model: Any
    optimizers: list          # (name, optimizer) pairs: tuner.worker.task.task_model
    batches: list
    task: Any = None
    trained: int = 0          # steps this model has trained in all

LIVE: dict[str, LiveModel] = {}


def key_of(spec: TrialSpec) -> str:
    return json.dumps([spec.task_path, spec.config, spec.seed], sort_keys=True)


def keep(spec: TrialSpec, model, optimizers, batches, task=None, trained: int = 0) -> None:
    LIVE[key_of(spec)] = LiveModel(model, optimizers, batches, task, trained)


def keep_only(spec_dicts: list[dict]) -> int:
    """Drop every live model but those of these specs' configs; returns how many are left."""
    wanted = {key_of(TrialSpec.from_dict(spec)) for spec in spec_dicts}
    for key in [key for key in LIVE if key not in wanted]:
        del LIVE[key]
    gc.collect()
    return len(LIVE)


def release() -> int:
    """Drop every live model; returns how many there were."""
    count = len(LIVE)
    LIVE.clear()
    gc.collect()
    return count
