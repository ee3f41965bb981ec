"""What the user asked a tuning job for (``Flags``), and the rules a resumed run holds those
flags to: a resumed run keeps its settings, and a flag that disagrees is refused in one line.
``tuner.run.plan.resolve`` turns flags into the run's plan."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tuner.errors import UsageError
from tuner.judging.decision import DEFAULT_MIN_GAIN
from tuner.judging.objective import Objective
from tuner.search.space_files import looks_like_path


DEFAULT_FINALISTS = 3
DEFAULT_TIME_LIMIT = 900


KEPT = {"kept": True}   # a resumed run keeps this setting: a value that differs is refused


@dataclass(frozen=True)
class Flags:
    """What the user asked for; ``None`` means "not given" (a default or the resumed run's).
    The fields marked ``KEPT`` are held to the resumed run's record (``check_resume``)."""

    task_path: Path
    run_dir: Path
    space: str | None = field(default=None, metadata=KEPT)
    trials: int | None = field(default=None, metadata=KEPT)
    steps: int | None = field(default=None, metadata=KEPT)
    seed: int | None = field(default=None, metadata=KEPT)
    tolerance: float | None = field(default=None, metadata=KEPT)
    exhaustive: bool = False
    tracking_uri: str | None = None
    finalists: int = DEFAULT_FINALISTS
    time_limit: float = DEFAULT_TIME_LIMIT  # seconds a trial may take before it is killed
    min_gain: float = DEFAULT_MIN_GAIN
    # The run-to-run allowance (None: RUN_DRIFT_SD); kept where the run recorded one.
    run_drift: float | None = field(default=None, metadata=KEPT)
    keep_slow_policies: bool = False
    objective: Objective | None = field(default=None, metadata=KEPT)
    memory_slack: float | None = field(default=None, metadata=KEPT)
    trial_seconds: float | None = None  # the sizing cap (tuner.judging.sizing); only without --steps
    confirm_steps: int | None = None    # the confirmation's length (tuner.run.confirmation_run)
    confirm_seconds: float | None = None
    no_confirm: bool = False


def space_ref(space: str) -> str:
    """How run.json names a space: a built-in name, or the YAML file's absolute path."""
    if looks_like_path(space):
        return str(Path(space).resolve())
    return space


def check_resume(previous: dict[str, Any], flags: Flags) -> None:
    """On resume, what the user passes must agree with what the run was started with."""
    run_dir = flags.run_dir
    if previous.get("status") == "finished":
        raise UsageError(f"the run in {str(run_dir)!r} already finished. Export its result "
                         f"(precision-tuner export --run-dir {run_dir}) or choose a new "
                         "--run-dir.")
    if previous["task"] != str(flags.task_path):
        raise UsageError(f"--run-dir {str(run_dir)!r} belongs to task {previous['task']!r}, "
                         f"not {str(flags.task_path)!r}. Pass that task, or a new --run-dir.")
    if flags.exhaustive and not previous.get("exhaustive"):
        raise UsageError(f"--exhaustive: the run in {str(run_dir)!r} was started with a "
                         "budget of trials; a resumed run keeps its settings. Drop --exhaustive, "
                         "or start a new --run-dir.")
    given = {kept.name: getattr(flags, kept.name) for kept in fields(Flags)
             if kept.metadata.get("kept") and (kept.name != "run_drift" or "run_drift" in previous)}
    if flags.space:
        given["space"] = space_ref(flags.space)
    if flags.trial_seconds is not None:
        raise UsageError(f"--trial-seconds {flags.trial_seconds:g}: a resumed run keeps how its "
                         "trials were sized. Drop --trial-seconds, or start a new --run-dir.")
    for key, value in given.items():
        flag = "--" + key.replace("_", "-")
        if value is not None and value != previous.get(key):
            raise UsageError(f"{flag} {value} differs from the interrupted run's "
                             f"{previous.get(key)!r}; a resumed run keeps its settings. Drop "
                             f"{flag}, or start a new --run-dir.")
