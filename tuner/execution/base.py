"""Where trials run. The driver hands a ``TrialSpec`` to an executor and gets a ``TrialResult``.

``Executor`` is the interface the trial loop relies on; ``tuner.execution.local``'s
``LocalProcessExecutor`` and ``tuner.execution.ray_pool``'s ``RayExecutor`` both satisfy it,
with the same error behaviour: a trial's own failure (an error, a crash, a timeout) comes back
as a failed ``TrialResult``; a bad task file raises ``TaskError`` from ``probe``/``diagnose``;
anything else around the trial raises ``TrialInfrastructureError``.
"""

from __future__ import annotations

from typing import ContextManager, Protocol, Sequence

from tuner.records.run_store import SubmissionLog
from tuner.trial_types import TrialResult, TrialSpec


class ExclusiveSession(Protocol):
    """Runs specs one after another on a worker that has its node to itself. Each config's
    model is built and traced on its first run and kept alive: a later run of the same config
    trains ``spec.steps`` more steps of it (``tuner.worker.live``)."""

    exclusive_timing: bool  # False when no node could be reserved: the timings were shared

    def run(self, spec: TrialSpec, time_limit_s: float) -> TrialResult: ...


class Executor(Protocol):
    """Runs trials: up to ``slots`` side by side for screening, or exclusively for timing."""

    @property
    def slots(self) -> int: ...
    def probe(self, task_path: str, steps: int, patterns: Sequence[str] = (),
              timeout_s: float = ..., ceiling: bool = ..., diagnose_steps: int = ...) -> dict: ...
    def diagnose(self, task_path: str, steps: int = ..., timeout_s: float = ...) -> dict: ...
    def in_flight(self) -> int: ...
    @property
    def runs_here(self) -> bool: ...  # trials run on this machine (the driver's)
    @property
    def keeps_live_models(self) -> bool: ...  # the re-measurement runs in the trials' worker
    def keep_live_only(self, specs: list[TrialSpec]) -> None: ...
    def submit(self, spec: TrialSpec, time_limit_s: float) -> None: ...
    def wait_any(self) -> list[TrialResult]: ...
    def exclusive(self) -> ContextManager[ExclusiveSession]: ...
    def close(self) -> None: ...

    # When set (``tuner.run.job.tune`` sets it), every spec is written to this log before a worker
    # gets it: search trials as "search", runs of an exclusive session as "re-measurement".
    submissions: SubmissionLog | None
