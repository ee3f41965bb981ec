"""What a guarded training reports in MLflow, stated once for both writers: the guard in a
user's process (``log_to_mlflow``) and ``precision-tuner train`` (tuner.run.guarded_training).
The lines that training writes for the command are tuner.process_lines'. Plain data: neither
Keras nor MLflow is imported here.
"""

from __future__ import annotations

import math
import sys

ARTIFACT = "precision_guard.json"          # the events and the amended config
EVENTS_TAG = "precision_guard.events"      # how many events, as a run tag


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
