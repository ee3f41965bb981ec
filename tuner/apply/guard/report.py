"""What a guarded training reports, stated once for the two sides of each exchange: its record
in MLflow (the guard in a user's process, ``log_to_mlflow``; ``precision-tuner train``,
tuner.run.guarded_training), and the lines a training run by ``precision-tuner train`` writes on
stdout (tuner.worker.guarded_train) for the command to read (``line``, ``read_line``): one per
epoch and one at the end. Plain data: neither Keras nor MLflow is imported here.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

ARTIFACT = "precision_guard.json"          # the events and the amended config
EVENTS_TAG = "precision_guard.events"      # how many events, as a run tag
EPOCH, DONE = "PT-EPOCH ", "PT-DONE "      # a line's kind: an epoch's figures, the result


def guard_record(events: list[dict], config: dict) -> dict:
    """The artifact: the guard's events and the config with its repairs (``to_dict()``)."""
    return {"events": events, "config": config}


def log_to_mlflow(history: list[dict], events: list[dict], config) -> None:
    """Per-epoch figures as metrics, events and the amended config as an artifact, in the
    MLflow run the user's process has open (none: nothing, and MLflow is not imported)."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or mlflow.active_run() is None:
        return
    for figures in history:
        mlflow.log_metrics({f"guard_{key}": value for key, value in figures.items()
                            if key != "epoch" and isinstance(value, (int, float))
                            and math.isfinite(value)}, step=figures["epoch"])
    mlflow.log_dict(guard_record(events, config.to_dict()), ARTIFACT)
    mlflow.set_tag(EVENTS_TAG, str(len(events)))


def line(kind: str, data: dict) -> str:
    """One line of ``kind`` (``EPOCH`` or ``DONE``) carrying ``data`` as JSON."""
    return kind + json.dumps(data)


def read_line(text: str) -> tuple[str | None, Any]:
    """``(kind, data)`` of a line ``line`` wrote; ``(None, None)`` for any other output."""
    for kind in (EPOCH, DONE):
        if text.startswith(kind):
            return kind, json.loads(text[len(kind):])
    return None, None
