"""Where trials run. The driver hands a ``TrialSpec`` to an executor and gets a ``TrialResult``.

``Executor`` is the base the trial loop relies on: ``tuner.execution.local``'s
``LocalProcessExecutor``, ``tuner.execution.ray_pool``'s ``RayExecutor`` and the tests' scripted
executor derive from it. It holds the defaults of an executor that runs one trial at a time on
another machine and keeps no models alive; an executor overrides what differs. Both real
executors have the same error behaviour: a trial's own failure (an error, a crash, a timeout)
comes back as a failed ``TrialResult``; a bad task file raises ``TaskError`` from
``probe``/``diagnose``; anything else around the trial raises ``TrialInfrastructureError``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, ContextManager, Protocol, Sequence, TypeVar

from tuner.records.run_store import SubmissionLog
from tuner.trial_types import TrialResult, TrialSpec

E = TypeVar("E", bound="Executor")


class ExclusiveSession(Protocol):
    """Runs specs one after another on a worker that has its node to itself. Each config's
    model is built and traced on its first run and kept alive: a later run of the same config
    trains ``spec.steps`` more steps of it (``tuner.worker.trial.live``)."""

    exclusive_timing: bool  # False when no node could be reserved: the timings were shared

    def run(self, spec: TrialSpec, time_limit_s: float) -> TrialResult: ...


class Executor(ABC):
    """Runs trials: up to ``slots`` side by side for screening, or exclusively for timing."""

    slots: int = 1                  # trials that run side by side
    runs_here: bool = False         # trials run on this machine (the driver's)
    keeps_live_models: bool = False  # the re-measurement runs in the trials' worker
    # When set (``tuner.run.job.tune`` sets it), every spec is written to this log before a worker
    # gets it: search trials as "search", runs of an exclusive session as "re-measurement".
    submissions: SubmissionLog | None = None
    # Called with a line when the job waits (for a node, a warm worker); the job points it at
    # its records. Only an executor on a shared cluster ever waits.
    announce: Callable[[str], None] | None = None
    node_losses: Sequence[str] = ()        # a line per node lost mid-trial, for run.json
    log_path: str | None = None            # a worker log on this machine, copied to the run
    exclusive_phases: Sequence[dict] = ()  # when and where each exclusive session ran
    chosen: dict | None = None             # which executor and why (tuner.execution.choice)

    @abstractmethod
    def probe(self, task_path: str, steps: int, patterns: Sequence[str] = (),
              timeout_s: float = 600.0, ceiling: bool = False,
              diagnose_steps: int = 0) -> dict:
        """Run the task-file checks that need TensorFlow
        (``tuner.worker.check.task_check.check_task``)."""

    @abstractmethod
    def diagnose(self, task_path: str, steps: int = 3, timeout_s: float = 600.0) -> dict:
        """Per-layer range diagnostics from a few float32 steps
        (``tuner.worker.diagnostics.diagnose``)."""

    @abstractmethod
    def in_flight(self) -> int:
        """Trials submitted and not yet returned by ``wait_any``."""

    @abstractmethod
    def submit(self, spec: TrialSpec, time_limit_s: float) -> None:
        """Start ``spec`` on a free slot."""

    @abstractmethod
    def wait_any(self) -> list[TrialResult]:
        """Block until at least one trial in flight ended; [] when none is in flight."""

    @abstractmethod
    def exclusive(self) -> ContextManager[ExclusiveSession]:
        """A session that times specs on a worker with its node to itself."""

    @abstractmethod
    def close(self) -> None:
        """Stop the workers this executor started."""

    def shut_down(self) -> None:
        """The job is done with the workers: stop what takes time to stop (Ray's instance),
        inside the job's wall time. A worker that stops at once is left to ``close``."""

    def keep_live_only(self, specs: list[TrialSpec]) -> dict | None:
        """Let the worker keep only these specs' models alive. Returns the worker's answer
        (``live``: how many it keeps, ``rss_before``/``rss_after``: its resident memory around
        the drop), None where there is none. An executor that keeps no models alive
        (``keeps_live_models`` False) has none to drop."""
        return None

    def replace_worker(self) -> dict | None:
        """Give the next trial a fresh worker process, where this executor can: whatever the
        trials' worker kept (live models, and what TensorFlow holds on to of every model a
        process trained) is gone. Returns ``rss_before`` (the old worker's resident memory) and
        ``rss_after`` (the fresh one's, started now), None where unknown. By default the live
        models are dropped in the same worker."""
        return self.keep_live_only([])

    def __enter__(self: E) -> E:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
