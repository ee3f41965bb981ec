"""Trials on Ray: a pool of long-lived TensorFlow actors, on this machine or a cluster.

- Each actor imports TensorFlow once, sizes TensorFlow's thread pools to its CPU share (or
  turns on memory growth on its GPU) and resets Keras's global state before every trial.
- ``RayExecutor`` starts the actors (or borrows the service's warm ones), ships a task once,
  and schedules trials on them: ``submit`` / ``wait_any``, one-off calls (the task check, the
  diagnostics) and ``run``.
- What happens when a trial ends badly (a crash, a lost node, a timeout) is
  tuner.execution.ray_lifecycle's; the finalists' exclusive timing on a node to themselves,
  tuner.execution.ray_exclusive's; the driver's view of one worker, tuner.execution.ray_slots.
- Timing honesty: trials that ran beside another trial on the same node are marked
  ``exclusive_timing=False``.

Past 300 lines: the pool's start (a local Ray instance or an existing cluster, its own actors
or the service's), its shipping of the task and its scheduling share the slots' bookkeeping.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Sequence

from tuner import job_context
from tuner.errors import (
    TaskError,
    TrialInfrastructureError,
    TunerError,
    UsageError,
    error_line,
    first_line,
)
from tuner.execution.base import Executor
from tuner.execution.ray_actor import trial_actor_class
from tuner.execution.ray_exclusive import ExclusiveTiming
from tuner.execution.ray_lifecycle import ActorLifecycle
from tuner.execution.ray_slots import ACTOR_START_TIMEOUT_S, PLACEMENT_TIMEOUT_S, Slot
from tuner.execution.task_shipping import shipment
from tuner.execution.warm_pool import Lender, find_keeper
from tuner.execution.watchdog import share_fate
from tuner.trial_types import TrialResult, TrialSpec


class RayExecutor(ActorLifecycle, ExclusiveTiming, Executor):
    """``workers`` actors; ``address=None`` starts (and later stops) a local Ray instance."""

    def __init__(self, workers: int | None = 1, address: str | None = None,
                 worker_cpus: int | None = None,
                 node_wait_s: float = PLACEMENT_TIMEOUT_S) -> None:
        """``worker_cpus``: CPUs per screening worker (default: the cluster's CPUs shared out
        among ``workers``, GPU or not, as the user's own training would have them; a service
        job takes a share, other jobs screen beside it). ``workers=None``: one per GPU of the
        cluster, one where it has none.
        ``node_wait_s``: how long ``exclusive()`` waits for a whole node before timing on a
        shared one (a service job waits its turn behind other jobs' re-measurements)."""
        import ray

        self.workers = workers
        self.address = address
        self.node_wait_s = node_wait_s
        self._owns_ray = self._closed = False
        self._fate = None
        # When and where each exclusive session ran: plain data for run.json and MLflow.
        self.exclusive_phases: list[dict] = []
        if not ray.is_initialized():
            self._start_ray(address)
        resources = ray.cluster_resources()
        self.total_cpus = int(resources.get("CPU", 1))
        self.total_gpus = float(resources.get("GPU", 0))
        if workers is None:
            self.workers = workers = max(1, int(self.total_gpus))
        self.gpus_per_worker = min(1.0, self.total_gpus / workers) if self.total_gpus else 0.0
        # Its share of the CPUs with GPUs too: one thread times a slower host than the user's.
        self.cpus_per_worker = max(1, self.total_cpus // workers)
        if worker_cpus:
            self.cpus_per_worker = max(1, min(worker_cpus, self.total_cpus))
        self._actor_class = trial_actor_class()
        self._lender = self._find_pool() if address is not None else None
        self._slots: list[Slot] = []
        self._finished: list[TrialResult] = []
        self.task_source_cache: dict[str, dict] = {}
        # Trials whose node was lost mid-trial, waiting for a worker on a surviving node; and
        # a line per node lost, for the summary and run.json.
        self._requeued: list[tuple[TrialSpec, float]] = []
        self.node_losses: list[str] = []

    def _start_ray(self, address: str | None) -> None:
        """A local Ray instance of our own (``address`` None) or a connection to a cluster;
        either failure is one line."""
        import ray

        try:
            if address is None:
                # A driver killed without ray.shutdown() takes the Ray it started along.
                self._fate = share_fate()
                # "local": a new instance of our own, even where `ray start` left a
                # cluster running on this machine (ray.init() would attach to that one).
                ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                         log_to_driver=False, logging_level=logging.WARNING,
                         object_store_memory=200 * 1024 * 1024)
                self._owns_ray = True
                self._fate.sync()  # Ray's processes are on the watchdog's list from now on
            else:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        # OSError: Ray's own checks at start (a socket path past 107 bytes under a long
        # TMPDIR) raise it, and it would reach the user as a traceback.
        except (OSError, RuntimeError, ValueError) as exc:
            if self._fate is not None:
                self._fate.release()
            if address is None:
                logs = Path(tempfile.gettempdir()) / "ray" / "session_latest" / "logs"
                raise TrialInfrastructureError(
                    f"cannot start a local Ray instance: {first_line(exc)}. Ray's logs: "
                    f"{logs}. Without Ray, one trial at a time: --executor local (and no "
                    "--workers)") from None
            raise UsageError(f"cannot connect to the Ray cluster at --ray-address {address}: "
                             f"{first_line(exc)}. Start it "
                             "(`ray start --head`) or fix the address.") from None

    # -- the pool --------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return self.workers

    def _start_actors(self, count: int, **options) -> list[Slot]:
        """Start ``count`` actors with these Ray options and wait until each is up."""
        import ray

        threads = int(options.get("num_cpus", 1))
        actors = [self._actor_class.options(**options).remote(threads,
                                                              bool(options.get("num_gpus")))
                  for _ in range(count)]
        try:
            nodes = ray.get([actor.node.remote() for actor in actors],
                            timeout=ACTOR_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            for actor in actors:
                ray.kill(actor)
            raise TrialInfrastructureError(
                f"Ray workers did not start within {ACTOR_START_TIMEOUT_S:.0f} s; is the "
                f"cluster short of CPUs/GPUs for --workers {self.workers}?") from None
        return [Slot(actor, node) for actor, node in zip(actors, nodes)]

    def _find_pool(self) -> Lender | None:
        """On the service's cluster: its warm workers, to borrow (tuner.execution.warm_pool;
        1 CPU each). A cluster with GPUs starts its own workers."""
        keeper = None if self.total_gpus else find_keeper()
        if keeper is None:
            return None
        self.cpus_per_worker = 1
        return Lender(keeper, job_context.job_id() or "tune")

    @property
    def warm(self) -> bool:
        """The workers are the service's warm ones, borrowed (not started by this job)."""
        return self._lender is not None

    def _screening(self) -> list[Slot]:
        return [s for s in self._slots if not s.timing]

    def _fill_pool(self) -> None:
        missing = self.workers - len(self._screening())
        if missing <= 0:
            return
        if self._lender is not None:
            self._borrow(missing)
            return
        options = {"num_cpus": self.cpus_per_worker, "scheduling_strategy": "SPREAD"}
        if self.gpus_per_worker:
            options["num_gpus"] = self.gpus_per_worker
        self._slots.extend(self._start_actors(missing, **options))

    def _borrow(self, missing: int) -> None:
        import ray

        lent = self._lender.borrow(missing, self.announce)
        nodes = ray.get([handle.node.remote() for _, handle, _ in lent],
                        timeout=ACTOR_START_TIMEOUT_S)
        self._slots.extend(Slot(handle, node, name=name)
                           for (name, handle, _), node in zip(lent, nodes))
        if len(lent) < missing:
            self.workers = len(self._screening())
            if self.announce is not None:
                self.announce(f"the service's pool lent {len(lent)} of the {missing} warm "
                              f"worker(s) asked for; running with {self.workers}")

    # -- checking the task -----------------------------------------------------------------
    def _shipped(self, task_path: str) -> dict:
        """The task, put in Ray's object store once per job (tuner.execution.task_shipping):
        a spec carries a digest and references, and a worker fetches what its node lacks the
        first time it sees the digest. Another node may not have the driver's files, and
        copying a task's data with every trial's spec would move it once per trial. A Ray
        instance of our own runs on this machine only: its workers read the data file where
        the driver wrote it, and the object store (200 MB) holds no copy of it."""
        if task_path not in self.task_source_cache:
            self.task_source_cache[task_path] = shipment(task_path, with_data=not self.runs_here)
        return self.task_source_cache[task_path]

    def _call(self, what: str, method: str, *args, timeout_s: float) -> dict:
        """A one-off job (task check, diagnostics) on the first actor.

        The same error behaviour as the local executor: a precision-tuner error raised in the
        worker (a bad task file: ``TaskError``) reaches the caller as that error; anything else
        is an infrastructure failure.
        """
        import ray

        self._fill_pool()
        slot = self._slots[0]
        # On a borrowed worker this is TensorFlow work like a trial (and the ceiling probe a
        # timing of its own): it waits while another job times on the node, and holds off
        # that job's re-measurement until it is done.
        if slot.name is not None:
            self._lender.begin(slot.name, self.announce)
        try:
            return ray.get(getattr(slot.actor, method).remote(*args), timeout=timeout_s)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            for kind in (TaskError, UsageError, TunerError):
                if isinstance(cause, kind):
                    raise kind(str(cause.args[0]) if cause.args else str(cause)) from None
            raise TrialInfrastructureError(f"{what} failed: {error_line(exc)}") from None
        except ray.exceptions.GetTimeoutError:
            self._replace(slot)
            raise TrialInfrastructureError(f"{what} took longer than {timeout_s:.0f} s "
                                           "(train_data() or build_model() may hang)") from None
        except ray.exceptions.RayError as exc:
            self._replace(slot)
            raise TrialInfrastructureError(f"the worker crashed during {what}: "
                                           f"{first_line(exc)}") from None
        finally:
            if slot.name is not None:
                self._lender.end(slot.name)

    def probe(self, task_path: str, steps: int, patterns: Sequence[str] = (),
              timeout_s: float = 600.0, ceiling: bool = False,
              diagnose_steps: int = 0) -> dict:
        return self._call("checking the task", "check_task", task_path, self._shipped(task_path),
                          steps, list(patterns), ceiling, diagnose_steps, timeout_s=timeout_s)

    def diagnose(self, task_path: str, steps: int = 3, timeout_s: float = 600.0) -> dict:
        return self._call("diagnostics", "diagnose", task_path, self._shipped(task_path), steps,
                          timeout_s=timeout_s)

    # -- running trials --------------------------------------------------------------------
    def in_flight(self) -> int:
        return sum(slot.running is not None for slot in self._slots) + len(self._requeued)

    def submit(self, spec: TrialSpec, time_limit_s: float, requeued: bool = False) -> None:
        self._fill_pool()
        slot = next(s for s in self._screening() if s.running is None)
        if slot.name is not None:
            self._lender.begin(slot.name, self.announce)
        if self.submissions is not None:
            self.submissions.write(spec, "search", requeued=requeued)
        slot.ref = slot.actor.run.remote(self._with_source(spec))
        slot.running, slot.started, slot.limit_s = spec.number, time.monotonic(), time_limit_s
        slot.spec = spec
        neighbours = [s for s in self._slots if s is not slot and s.running is not None
                      and s.node == slot.node]
        slot.overlapped = bool(neighbours)
        for other in neighbours:
            other.overlapped = True

    def _with_source(self, spec: TrialSpec) -> dict:
        return {**spec.to_dict(), "shipped": self._shipped(spec.task_path)}

    def wait_any(self) -> list[TrialResult]:
        """Block until at least one in-flight trial finished (or crashed, or timed out)."""
        import ray

        while True:
            while self._requeued and (len(self._screening()) < self.workers
                                      or any(s.running is None for s in self._screening())):
                self.submit(*self._requeued.pop(0), requeued=True)
            busy = [s for s in self._slots if s.running is not None]
            if not busy:
                return []
            now = time.monotonic()
            nearest = min(s.started + s.limit_s - now for s in busy)
            ready, _ = ray.wait([s.ref for s in busy], num_returns=1,
                                timeout=max(0.05, min(nearest, 1.0)))
            results = [r for r in (self._collect(s) for s in busy if s.ref in ready)
                       if r is not None]
            now = time.monotonic()
            for slot in busy:
                if slot.ref not in ready and now - slot.started > slot.limit_s:
                    results.append(self._timeout(slot))
            if results:
                return results

    @property
    def runs_here(self) -> bool:
        """Trials run on this machine: a Ray instance this job started (not --ray-address)."""
        return self._owns_ray

    def run(self, spec: TrialSpec, time_limit_s: float) -> TrialResult:
        """Run one trial and wait for it (nothing else may be in flight)."""
        if self.in_flight():
            raise TrialInfrastructureError("run() needs an idle pool")
        self.submit(spec, time_limit_s)
        (result,) = self.wait_any()
        return result

    @property
    def keeps_live_models(self) -> bool:
        """True when the re-measurement will run in the actor that runs the trials (a Ray
        instance this job started, one worker): models kept alive there are timed again."""
        return self._owns_ray and self.workers == 1

    def keep_live_only(self, specs: list[TrialSpec]) -> dict | None:
        """Let the trials' actor keep only these specs' models alive (its answer: see base)."""
        import ray

        if self._slots and not self.in_flight():
            return ray.get(self._slots[0].actor.keep_live_only.remote(
                [s.to_dict() for s in specs]), timeout=60)
        return None

    def replace_worker(self) -> dict | None:
        """Where the trials' one actor keeps live models: a fresh actor in its place (see
        base); elsewhere the live models dropped."""
        import ray

        if not self.keeps_live_models or not self._slots or self.in_flight():
            return self.keep_live_only([])
        try:
            before = ray.get(self._slots[0].actor.memory.remote(), timeout=60)
            self._replace(self._slots[0])
            self._fill_pool()
            after = ray.get(self._slots[-1].actor.memory.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - a failed start is the next trial's to report
            return None
        return {"live": 0, "rss_before": before.get("rss_bytes"),
                "rss_after": after.get("rss_bytes"), "replaced": True}

    def shut_down(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (a borrowed pool's go back) and the Ray this executor started;
        once (the job closes it inside its wall time, the ``with`` again)."""
        import ray

        if self._closed:
            return
        self._closed = True
        if self._lender is not None:
            # Idle workers go back; one still running a trial (the job was interrupted) is
            # replaced, as a job's own would be killed: no trial may outlive its job.
            idle = [s for s in self._slots if s.name is not None and s.running is None
                    and not s.timing]
            self._slots = [s for s in self._slots if s not in idle]
            if idle:
                self._lender.give_back([s.name for s in idle])
            self._lender.unlock()
        for slot in list(self._slots):
            self._replace(slot)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        if self._fate is not None:
            self._fate.release()
            self._fate = None
