"""The run directory's own records, written so that a kill at any moment loses nothing.

- ``run.json``: what was asked (task, space, budget, seed, study and MLflow ids); written once,
  atomically, before the first trial. Holds no secrets (never the tracking URI).
- ``trials.jsonl``: one line per finished trial, appended and fsync'ed as each one finishes;
  a line cut short by a kill is ignored on reading.
- ``trials.json``: every trial as one document, rewritten atomically at the end.
- ``submitted.jsonl``: one line per trial spec handed to a worker (search trials and
  re-measurement runs), written by the driver before the worker gets it, so that a trial whose
  worker crashed, or whose driver was killed, is still known to have started. What the fault
  suite checks every other record against.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from tuner.errors import UsageError

RUN_FILE = "run.json"
BEST_FILE = "best_precision.json"   # the exported config, written last
TRIALS_LOG = "trials.jsonl"
SUBMITTED_LOG = "submitted.jsonl"
RUN_SCHEMA_VERSION = 1


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class RunStore:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    @property
    def exists(self) -> bool:
        return (self.run_dir / RUN_FILE).is_file()

    def read_run(self) -> dict[str, Any]:
        path = self.run_dir / RUN_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read {path}: {exc}. The run directory is damaged; start a "
                             "new one with another --run-dir.") from None
        if data.get("schema_version", 0) > RUN_SCHEMA_VERSION:
            raise UsageError(f"{path} was written by a newer precision-tuner (schema "
                             f"{data.get('schema_version')}). Upgrade precision-tuner.")
        return data

    def write_run(self, data: dict[str, Any]) -> None:
        write_atomic(self.run_dir / RUN_FILE,
                     json.dumps({"schema_version": RUN_SCHEMA_VERSION, **data}, indent=2) + "\n")

    def update_run(self, **changes: Any) -> None:
        self.write_run({**self.read_run(), **changes})

    def append_trial(self, record: dict[str, Any]) -> None:
        append_line(self.run_dir / TRIALS_LOG, record)

    def repair_trials_log(self) -> bool:
        """Drop a last line a kill cut short (no newline yet), before a resume appends to the
        log: appended to it, the next record would be unreadable too. True if one was cut."""
        path = self.run_dir / TRIALS_LOG
        if not path.is_file():
            return False
        data = path.read_bytes()
        if not data or data.endswith(b"\n"):
            return False
        with open(path, "r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def read_trials(self) -> list[dict[str, Any]]:
        path = self.run_dir / TRIALS_LOG
        if not path.is_file():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a kill: that trial is re-run
        return records

    def write_trials(self, records: list[dict[str, Any]]) -> None:
        write_atomic(self.run_dir / "trials.json", json.dumps(records, indent=1, default=str))


class SubmissionLog:
    """``submitted.jsonl``: what the executors handed to their workers, one line per spec."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, spec, phase: str, requeued: bool = False) -> None:
        """Record ``spec`` (a ``TrialSpec``) as handed to a worker in ``phase`` ("search" or
        "re-measurement"); ``requeued``: again, after the node it ran on was lost."""
        line = {"number": spec.number, "phase": phase, "config": spec.config,
                "steps": spec.steps, "pid": os.getpid(),
                "time": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        if requeued:
            line["requeued"] = True
        append_line(self.path, line)


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` to a JSON-lines file as one line, on disk (fsync'ed) when this returns."""
    with open(path, "a") as handle:
        handle.write(json.dumps(record, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
