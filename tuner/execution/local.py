"""Trials in one local subprocess: ``LocalProcessExecutor``, a ``tuner.execution.base.Executor``.

``LocalProcessExecutor`` keeps one long-lived worker program (tuner.execution.local_worker; its
own program, so the driver never imports TensorFlow and the worker never re-runs the caller's
script): TensorFlow is imported once and reused across trials. The program serves the worker's
one face, a ``TrialWorker`` (tuner.worker.process.trial_worker), whose methods this executor
calls by name with the arguments the Ray executor passes its actors. A worker that dies (segfault,
killed for memory) fails only that trial and is replaced; a trial past its time limit has its
worker killed and is recorded as a timeout.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Iterator, Sequence

from tuner.errors import TrialInfrastructureError, TunerError, error_line
from tuner.execution.base import Executor
from tuner.execution.local_worker import WorkerDied, WorkerProcess, WorkerTimedOut
from tuner.trial_types import FailureClass, TrialResult, TrialSpec

# What the worker's methods take for a task the driver ships (tuner.execution.task_shipping):
# nothing, the local worker reads the driver's own task file.
_NOT_SHIPPED = None


def fresh_process_peak_rss(spec: TrialSpec, timeout_s: float = 600.0) -> int | None:
    """Run ``spec`` in a fresh worker process on this machine and return that process's peak
    RSS (TensorFlow's own footprint included): a check of the counted training memory that no
    earlier trial can disturb. None when the run fails."""
    executor = LocalProcessExecutor()
    try:
        answer = executor._call("a fresh-process memory check", "run_for_peak_rss",
                                spec.to_dict(), timeout_s=timeout_s)
    except TunerError:
        return None
    finally:
        executor.close()
        with contextlib.suppress(OSError):
            os.unlink(executor.log_path)
    ok = answer["result"]["outcome"] == "completed"
    return int(answer["peak_rss_bytes"]) if ok else None


class LocalProcessExecutor(Executor):
    """One reusable worker process on this machine; trials run one at a time (exclusive)."""

    runs_here = True  # trials run on this machine
    keeps_live_models = True  # one worker runs the trials and the re-measurement

    def __init__(self, log_path: str | None = None) -> None:
        if log_path is None:
            handle, log_path = tempfile.mkstemp(prefix="precision-tuner-worker-", suffix=".log")
            os.close(handle)
        self.log_path = log_path
        self._worker: WorkerProcess | None = None
        self._pending: tuple[TrialSpec, float] | None = None

    def _ensure_worker(self) -> WorkerProcess:
        if self._worker is None:
            self._worker = WorkerProcess(self.log_path)
        return self._worker

    def _call(self, what: str, method: str, *args, timeout_s: float) -> dict:
        """Run a one-off job (task check, diagnostics) in the worker; TaskError passes through."""
        try:
            return self._ensure_worker().call(method, *args, timeout_s=timeout_s)
        except TunerError:
            raise  # a bad task file (TaskError) reaches the caller as itself
        except WorkerTimedOut:
            self._worker = None
            raise TrialInfrastructureError(
                f"{what} took longer than {timeout_s:.0f} s (train_data() or build_model() may "
                "hang); see the worker log " + self.log_path) from None
        except WorkerDied as died:
            self._worker = None
            raise TrialInfrastructureError(
                f"the worker process crashed during {what} ({died}); see the worker log "
                + self.log_path) from None
        except Exception as exc:  # noqa: BLE001 - the same as on Ray: not the user's input
            raise TrialInfrastructureError(f"{what} failed: {error_line(exc)}") from None

    def probe(self, task_path: str, steps: int, patterns: Sequence[str] = (),
              timeout_s: float = 600.0, ceiling: bool = False,
              diagnose_steps: int = 0) -> dict:
        """Run the task-file checks that need TensorFlow; raises TaskError on a bad task.
        Also reports which layers each float32 group and each of ``patterns`` selects, with
        ``ceiling`` each precision's speed on the worker's device, and with ``diagnose_steps``
        the model's diagnostics (``tuner.worker.check.task_check.check_task``)."""
        return self._call("checking the task", "check_task", task_path, _NOT_SHIPPED, steps,
                          list(patterns), ceiling, diagnose_steps, timeout_s=timeout_s)

    def diagnose(self, task_path: str, steps: int = 3, timeout_s: float = 600.0) -> dict:
        """Per-layer range diagnostics from a few float32 steps (see
        tuner.worker.diagnostics.diagnose)."""
        return self._call("diagnostics", "diagnose", task_path, _NOT_SHIPPED, steps,
                          timeout_s=timeout_s)

    # The same interface as RayExecutor, with one slot: a submitted trial runs in wait_any().
    def in_flight(self) -> int:
        return 0 if self._pending is None else 1

    def submit(self, spec: TrialSpec, time_limit_s: float) -> None:
        if self._pending is not None:
            raise TrialInfrastructureError("the local executor runs one trial at a time")
        self._pending = (spec, time_limit_s)

    def wait_any(self) -> list[TrialResult]:
        if self._pending is None:
            return []
        (spec, limit), self._pending = self._pending, None
        return [self.run(spec, limit)]

    def keep_live_only(self, specs: list[TrialSpec]) -> dict | None:
        """Let the worker keep only these specs' models alive (its answer: see base)."""
        return self._quietly("keep_live_only", [s.to_dict() for s in specs])

    def replace_worker(self) -> dict | None:
        """The worker stopped and a fresh one started (see base)."""
        before = self._quietly("memory") or {}
        self.close()
        with contextlib.suppress(Exception):
            self._ensure_worker()   # a failed start is the next trial's to report
        after = self._quietly("memory") or {}
        return {"live": 0, "rss_before": before.get("rss_bytes"),
                "rss_after": after.get("rss_bytes"), "replaced": True}

    def _quietly(self, method: str, *args):
        """Housekeeping in the worker; a crashed worker keeps nothing anyway (None)."""
        if self._worker is not None:
            with contextlib.suppress(Exception):
                return self._worker.call(method, *args, timeout_s=60)
        return None

    @contextlib.contextmanager
    def exclusive(self) -> Iterator["_LocalSession"]:
        """One worker, one trial at a time: always exclusive. The session's live models (the
        float32 baseline's among them) are released when it ends."""
        try:
            yield _LocalSession(self)
        finally:
            self._quietly("release_live")

    def run(self, spec: TrialSpec, time_limit_s: float, method: str = "run") -> TrialResult:
        """``spec`` as a trial (``method`` "run") or on its live model (``"run_live"``)."""
        if self.submissions is not None:
            self.submissions.write(spec, "re-measurement" if method == "run_live" else "search")
        try:
            answer = self._ensure_worker().call(method, spec.to_dict(), timeout_s=time_limit_s)
        except WorkerTimedOut:
            self._worker = None
            return TrialResult.failed(spec.number, FailureClass.TIMEOUT,
                                      f"trial exceeded its time limit of {time_limit_s:.0f} s; "
                                      "worker killed", warmup_steps=spec.warmup_steps)
        except WorkerDied as died:
            self._worker = None
            return TrialResult.failed(spec.number, FailureClass.WORKER_CRASHED,
                                      f"worker process crashed ({died}); replaced",
                                      warmup_steps=spec.warmup_steps)
        return TrialResult.from_dict(answer)

    def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()


class _LocalSession:
    """The local worker's exclusive session: each config on a model the worker keeps alive."""

    exclusive_timing = True

    def __init__(self, executor: LocalProcessExecutor) -> None:
        self._executor = executor

    def run(self, spec: TrialSpec, time_limit_s: float) -> TrialResult:
        return self._executor.run(spec, time_limit_s, method="run_live")
