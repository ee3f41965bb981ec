"""The lines a process the driver starts writes on stdout for it to read: a kind word, then the
figures as JSON, on one line (everything else the process prints is left alone). Written by
tuner.worker.programs.one_training (an epoch's figures, the result) and
tuner.worker.programs.one_measurement (one measurement); read by tuner.run.guarded_training
and tuner.run.bench. Plain data.
"""

from __future__ import annotations

import json
from typing import Any

EPOCH, DONE = "PT-EPOCH ", "PT-DONE "    # precision-tuner train: an epoch's figures, the result
BENCH = "PT-BENCH "                      # precision-tuner bench: one measurement
DEVICES = "PT-DEVICES "                  # how a process configured its devices, first thing
KINDS = (EPOCH, DONE, BENCH, DEVICES)


def line(kind: str, data: dict) -> str:
    """One line of ``kind`` (one of ``KINDS``) carrying ``data`` as JSON."""
    return kind + json.dumps(data)


def read_line(text: str) -> tuple[str | None, Any]:
    """``(kind, data)`` of a line ``line`` wrote; ``(None, None)`` for any other output."""
    for kind in KINDS:
        if text.startswith(kind):
            return kind, json.loads(text[len(kind):])
    return None, None
