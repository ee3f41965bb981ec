"""Trials in one local subprocess: ``LocalProcessExecutor`` (``tuner.execution.base.Executor``).

``LocalProcessExecutor`` keeps one long-lived worker process (spawned, so the driver never
imports TensorFlow): TensorFlow is imported once and reused across trials. A worker that dies
(segfault, killed for memory) fails only that trial and is replaced; a trial past its time limit
has its worker killed and is recorded as a timeout.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import tempfile
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Iterator, Sequence

from tuner.errors import TrialInfrastructureError, TunerError, error_line
from tuner.records.run_store import SubmissionLog
from tuner.trial_types import FailureClass, TrialResult, TrialSpec
from tuner.worker import process as worker_process
from tuner.worker.live import run_live
from tuner.worker.live_models import keep_only, release
from tuner.worker.trial import run_trial


def fresh_process_peak_rss(spec: TrialSpec, timeout_s: float = 600.0) -> int | None:
    """Run ``spec`` in a fresh worker process on this machine and return that process's peak
    RSS (TensorFlow's own footprint included): a check of the counted training memory that no
    earlier trial can disturb. None when the run fails."""
    executor = LocalProcessExecutor()
    try:
        answer = executor._call("a fresh-process memory check", worker_process.run_for_peak_rss,
                                spec.to_dict(), timeout_s=timeout_s)
    except TunerError:
        return None
    finally:
        executor.close()
        with contextlib.suppress(OSError):
            os.unlink(executor.log_path)
    ok = answer["result"]["outcome"] == "completed"
    return int(answer["peak_rss_bytes"]) if ok else None


class LocalProcessExecutor:
    """One reusable worker process on this machine; trials run one at a time (exclusive)."""

    slots = 1
    runs_here = True  # trials run on this machine

    def __init__(self, log_path: str | None = None) -> None:
        if log_path is None:
            handle, log_path = tempfile.mkstemp(prefix="precision-tuner-worker-", suffix=".log")
            os.close(handle)
        self.log_path = log_path
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        # The pool's worker process, held here: once the pool breaks, its own list may already
        # be emptied by its management thread, and the crash's exit code with it.
        self._workers: list = []
        self._pending: tuple[TrialSpec, float] | None = None
        self.submissions: SubmissionLog | None = None

    def _ensure_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                initializer=worker_process.start_local_worker, initargs=(self.log_path,))
        return self._pool

    def _call(self, what: str, function, *args, timeout_s: float) -> dict:
        """Run a one-off job (task check, diagnostics) in the worker; TaskError passes through."""
        future = self._ensure_pool().submit(function, *args)
        try:
            return future.result(timeout=timeout_s)
        except TunerError:
            raise  # a bad task file (TaskError) reaches the caller as itself
        except concurrent.futures.TimeoutError:
            self._kill()
            raise TrialInfrastructureError(
                f"{what} took longer than {timeout_s:.0f} s (train_data() or build_model() may "
                "hang); see the worker log " + self.log_path) from None
        except BrokenProcessPool:
            self._kill()
            raise TrialInfrastructureError(
                f"the worker process crashed during {what}; see " + self.log_path) from None
        except Exception as exc:  # noqa: BLE001 - the same as on Ray: not the user's input
            raise TrialInfrastructureError(f"{what} failed: {error_line(exc)}") from None

    def probe(self, task_path: str, steps: int, patterns: Sequence[str] = (),
              timeout_s: float = 600.0, ceiling: bool = False,
              diagnose_steps: int = 0) -> dict:
        """Run the task-file checks that need TensorFlow; raises TaskError on a bad task.
        Also reports which layers each float32 group and each of ``patterns`` selects, with
        ``ceiling`` each precision's speed on the worker's device, and with ``diagnose_steps``
        the model's diagnostics (``tuner.worker.probe.probe_task``)."""
        return self._call("checking the task", worker_process.probe, task_path, steps, list(patterns),
                          ceiling, diagnose_steps, timeout_s=timeout_s)

    def diagnose(self, task_path: str, steps: int = 3, timeout_s: float = 600.0) -> dict:
        """Per-layer range diagnostics from a few float32 steps (see tuner.worker.diagnose)."""
        return self._call("diagnostics", worker_process.diagnose, task_path, steps, timeout_s=timeout_s)

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

    keeps_live_models = True  # one worker runs the trials and the re-measurement

    def keep_live_only(self, specs: list[TrialSpec]) -> None:
        """Let the worker keep only these specs' models alive."""
        if self._pool is not None:
            with contextlib.suppress(Exception):  # a crashed worker keeps nothing anyway
                self._pool.submit(keep_only, [s.to_dict() for s in specs]).result(
                    timeout=60)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator["_LocalSession"]:
        """One worker, one trial at a time: always exclusive. The session's live models (the
        float32 baseline's among them) are released when it ends."""
        try:
            yield _LocalSession(self)
        finally:
            if self._pool is not None:
                with contextlib.suppress(Exception):
                    self._pool.submit(release).result(timeout=60)

    def run(self, spec: TrialSpec, time_limit_s: float, function=run_trial) -> TrialResult:
        if self.submissions is not None:
            self.submissions.write(spec, "re-measurement" if function is run_live else "search")
        future = self._ensure_pool().submit(function, spec.to_dict())
        self._workers = list(getattr(self._pool, "_processes", {}).values()) or self._workers
        try:
            return TrialResult.from_dict(future.result(timeout=time_limit_s))
        except concurrent.futures.TimeoutError:
            self._kill()
            return TrialResult.failed(spec.number, FailureClass.TIMEOUT,
                                      f"trial exceeded its time limit of {time_limit_s:.0f} s; "
                                      "worker killed", warmup_steps=spec.warmup_steps)
        except BrokenProcessPool:
            code = self._kill()
            return TrialResult.failed(spec.number, FailureClass.WORKER_CRASHED,
                                      f"worker process crashed (exit code {code}); replaced",
                                      warmup_steps=spec.warmup_steps)

    def _kill(self) -> int | None:
        """Kill the worker process (a running TensorFlow op cannot be interrupted otherwise)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return None
        code = None
        processes = list(getattr(pool, "_processes", {}).values()) or self._workers
        self._workers = []
        for process in processes:
            if process.is_alive():
                process.kill()
            exit_code = _exit_code(process, 5.0)
            code = exit_code if code is None else code
        pool.shutdown(wait=False, cancel_futures=True)
        return code

    def close(self) -> None:
        pool, self._pool, self._workers = self._pool, None, []
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "LocalProcessExecutor":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _exit_code(process, timeout_s: float) -> int | None:
    """``process``'s exit code once it is dead. The broken pool's own thread joins the same
    process: when it reaps it between our check and our ``waitpid``, ours fails and reads None
    until that thread has stored the code (seen as "exit code None" under the OOM killer), so
    keep reading until it has, within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    process.join(timeout_s)
    while process.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return process.exitcode


class _LocalSession:
    """The local worker's exclusive session: each config on a model the worker keeps alive."""

    exclusive_timing = True

    def __init__(self, executor: LocalProcessExecutor) -> None:
        self._executor = executor

    def run(self, spec: TrialSpec, time_limit_s: float) -> TrialResult:
        return self._executor.run(spec, time_limit_s, function=run_live)
