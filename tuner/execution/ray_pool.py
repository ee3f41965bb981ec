"""Trials on Ray: a pool of long-lived TensorFlow actors, on this machine or a cluster.

- Each actor imports TensorFlow once, sizes TensorFlow's thread pools to its CPU share (or
  turns on memory growth on its GPU) and resets Keras's global state before every trial.
- Ray never retries a trial: actors have ``max_restarts=0`` and ``max_task_retries=0``. An actor
  that dies (segfault, killed for memory) fails that trial as "worker crashed" and is replaced;
  a trial past its time limit has its actor killed (a running TensorFlow op cannot be
  interrupted otherwise) and is recorded as "timeout".
- Timing honesty: trials that ran beside another trial on the same node are marked
  ``exclusive_timing=False``. The finalists are re-measured in ``exclusive()``: one actor
  inside a placement group that reserves a whole node, so no other Ray work shares it
  (``exclusive()``); a crash there costs that run only, the session goes on on a fresh actor.

Past 300 lines: the actor pool, its exclusive sessions (placement groups) and the handling of
lost nodes and hung actors share the slots' bookkeeping.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from tuner import job_context
from tuner.errors import (TaskError, TrialInfrastructureError, TunerError, UsageError, error_line,
                          first_line)
from tuner.records.run_store import SubmissionLog
from tuner.trial_types import FailureClass, TrialResult, TrialSpec
from tuner.execution.ray_actor import trial_actor_class
from tuner.execution.warm_pool import Lender, find_keeper
from tuner.execution.watchdog import share_fate

_PLACEMENT_TIMEOUT_S = 120.0
_ACTOR_START_TIMEOUT_S = 600.0


@dataclass
class _Slot:
    actor: object
    node: str
    running: int | None = None          # trial number
    ref: object = None
    started: float = 0.0
    limit_s: float = 0.0
    overlapped: bool = False             # another trial ran on the same node meanwhile
    spec: TrialSpec | None = None        # what it runs, to re-queue if its node is lost
    name: str | None = None              # a warm worker borrowed from the service's pool
    timing: bool = False                 # the pool's timing worker, lent for a timed phase


class RayExecutor:
    """``workers`` actors; ``address=None`` starts (and later stops) a local Ray instance."""

    def __init__(self, workers: int = 1, address: str | None = None,
                 worker_cpus: int | None = None,
                 node_wait_s: float = _PLACEMENT_TIMEOUT_S) -> None:
        """``worker_cpus``: CPUs per screening worker (default: the cluster's CPUs shared out
        among ``workers``; a service job takes a share, other jobs screen beside it).
        ``node_wait_s``: how long ``exclusive()`` waits for a whole node before timing on a
        shared one (a service job waits its turn behind other jobs' re-measurements)."""
        import ray

        self.workers = workers
        self.address = address
        self.node_wait_s = node_wait_s
        self._owns_ray = False
        self._fate = None
        # Called with a line when the job waits (for a node); the job points it at its records.
        self.announce = None
        # When and where each exclusive session ran: plain data for run.json and MLflow.
        self.exclusive_phases: list[dict] = []
        if not ray.is_initialized():
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
                else:
                    ray.init(address=address, log_to_driver=False,
                             logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                if self._fate is not None:
                    self._fate.release()
                if address is None:
                    raise TrialInfrastructureError(f"cannot start a local Ray instance: "
                                                   f"{first_line(exc)}") from None
                raise UsageError(f"cannot connect to the Ray cluster at --ray-address {address}: "
                                 f"{first_line(exc)}. Start it "
                                 "(`ray start --head`) or fix the address.") from None
        resources = ray.cluster_resources()
        self.total_cpus = int(resources.get("CPU", 1))
        self.total_gpus = float(resources.get("GPU", 0))
        self.gpus_per_worker = min(1.0, self.total_gpus / workers) if self.total_gpus else 0.0
        self.cpus_per_worker = max(1, self.total_cpus // workers) if not self.total_gpus else 1
        if worker_cpus:
            self.cpus_per_worker = max(1, min(worker_cpus, self.total_cpus))
        self._actor_class = trial_actor_class()
        self._lender = self._find_pool() if address is not None else None
        self._slots: list[_Slot] = []
        self._finished: list[TrialResult] = []
        self.task_source_cache: dict[str, dict] = {}
        self.submissions: SubmissionLog | None = None  # see tuner.execution.local.Executor
        # Trials whose node was lost mid-trial, waiting for a worker on a surviving node; and
        # a line per node lost, for the summary and run.json.
        self._requeued: list[tuple[TrialSpec, float]] = []
        self.node_losses: list[str] = []

    # -- the pool --------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return self.workers

    def _start_actors(self, count: int, **options) -> list[_Slot]:
        """Start ``count`` actors with these Ray options and wait until each is up."""
        import ray

        threads = int(options.get("num_cpus", 1))
        actors = [self._actor_class.options(**options).remote(threads,
                                                              bool(options.get("num_gpus")))
                  for _ in range(count)]
        try:
            nodes = ray.get([actor.node.remote() for actor in actors],
                            timeout=_ACTOR_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            for actor in actors:
                ray.kill(actor)
            raise TrialInfrastructureError(
                f"Ray workers did not start within {_ACTOR_START_TIMEOUT_S:.0f} s; is the "
                f"cluster short of CPUs/GPUs for --workers {self.workers}?") from None
        return [_Slot(actor, node) for actor, node in zip(actors, nodes)]

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

    def _screening(self) -> list[_Slot]:
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
                        timeout=_ACTOR_START_TIMEOUT_S)
        self._slots.extend(_Slot(handle, node, name=name)
                           for (name, handle, _), node in zip(lent, nodes))
        if len(lent) < missing:
            self.workers = len(self._screening())
            if self.announce is not None:
                self.announce(f"the service's pool lent {len(lent)} of the {missing} warm "
                              f"worker(s) asked for; running with {self.workers}")

    # -- checking the task -----------------------------------------------------------------
    def _shipped(self, task_path: str) -> dict:
        """The task file's code, put in Ray's object store once per job: a spec carries its
        digest and a reference (in a list, so Ray passes it unresolved), and a worker fetches
        the code the first time it sees the digest. Another node may not have the driver's
        file, and a task written by tuner.tune() embeds the user's arrays: copying them with
        every trial's spec would move them once per trial."""
        if task_path not in self.task_source_cache:
            import ray

            source = Path(task_path).read_text()
            self.task_source_cache[task_path] = {
                "digest": hashlib.sha256(source.encode()).hexdigest()[:16],
                "ref": [ray.put(source)]}
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
        return self._call("checking the task", "probe", task_path, self._shipped(task_path),
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

    def _collect(self, slot: _Slot) -> TrialResult | None:
        """The slot's result; None when its node was lost and the trial is re-queued."""
        import ray

        number = slot.running
        if slot.name is not None and not slot.timing:
            slot.overlapped = self._lender.end(slot.name) or slot.overlapped
        try:
            result = TrialResult.from_dict(ray.get(slot.ref))
            result.exclusive_timing = not slot.overlapped
        except ray.exceptions.OutOfMemoryError as exc:
            result = self._failed(slot, FailureClass.OUT_OF_MEMORY,
                                  f"Ray killed the worker for memory: {first_line(exc)}")
            self._replace(slot)
        except ray.exceptions.RayActorError as exc:
            if self._node_lost(slot):
                return None
            result = self._failed(slot, FailureClass.WORKER_CRASHED,
                                  f"worker process crashed ({first_line(exc, 200)}); replaced")
            self._replace(slot)
        except ray.exceptions.RayError as exc:
            result = self._failed(slot, FailureClass.OTHER, first_line(exc))
        assert result.number == number
        slot.running = slot.ref = None
        return result

    def _node_lost(self, slot: _Slot) -> bool:
        """When the slot's node is gone from the cluster (not just its worker process): the
        trial is no fault of its config, so it is queued again for a worker on a surviving
        node, and the pool shrinks by that worker (the cluster has fewer CPUs now)."""
        import ray

        node_id = slot.node.rsplit("/", 1)[-1]
        try:
            alive = any(n["Alive"] for n in ray.nodes() if n["NodeID"].startswith(node_id))
        except Exception:  # noqa: BLE001 - the cluster cannot say: count it as a crash
            return False
        if alive:
            return False
        self._requeued.append((slot.spec, slot.limit_s))
        self._slots.remove(slot)
        self.workers = max(1, self.workers - 1)
        self.node_losses.append(f"node {slot.node} was lost during trial #{slot.running}; "
                                f"the trial ran again on a surviving node, and the job went on "
                                f"with {self.workers} worker(s)")
        return True

    def _timeout(self, slot: _Slot) -> TrialResult:
        if slot.name is not None and not slot.timing:
            self._lender.end(slot.name)
        result = self._failed(slot, FailureClass.TIMEOUT,
                              f"trial exceeded its time limit of {slot.limit_s:.0f} s; worker "
                              "killed")
        self._replace(slot)
        slot.running = slot.ref = None
        return result

    def _failed(self, slot: _Slot, failure: FailureClass, message: str) -> TrialResult:
        result = TrialResult.failed(slot.running, failure, message, node=slot.node)
        result.wall_s = time.monotonic() - slot.started
        return result

    @property
    def runs_here(self) -> bool:
        """Trials run on this machine: a Ray instance this job started (not --ray-address)."""
        return self._owns_ray

    def _replace(self, slot: _Slot) -> None:
        """Kill a slot's actor (no restart) and put a fresh one in its place, lazily (a warm
        worker: the pool's keeper kills it and starts its successor)."""
        import ray

        if slot.name is not None:
            self._lender.replace(slot.name)
            self._slots.remove(slot)
            return
        try:
            ray.kill(slot.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - it may already be gone
            pass
        self._slots.remove(slot)

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

    def keep_live_only(self, specs: list[TrialSpec]) -> None:
        """Let the trials' actor keep only these specs' models alive."""
        import ray

        if self._slots and not self.in_flight():
            ray.get(self._slots[0].actor.keep_live_only.remote([s.to_dict() for s in specs]),
                    timeout=60)

    # -- exclusive timing ------------------------------------------------------------------
    @contextlib.contextmanager
    def exclusive(self) -> Iterator["_ExclusiveSession"]:
        """One actor with a whole node to itself (a placement group reserves every CPU), for
        timings that pick the winner. When the cluster is too busy to reserve a node, the work
        runs anyway and the session says its timings were shared."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        if self._lender is not None:
            with self._pooled_exclusive() as session:
                yield session
            return
        if self._owns_ray and self.workers == 1 and self._slots and not self.in_flight():
            # A Ray instance this job started runs nothing but its one actor, idle now: that
            # actor has the machine to itself already, TensorFlow imported and the baseline's
            # model alive (tuner.worker.live). No reservation, no fresh process.
            session = _ExclusiveSession(self, None, {}, slot=self._slots[0], exclusive=True)
            began = time.time()
            try:
                yield session
            finally:
                session.release()
                self._record_phase(self._slots[0].node if self._slots else "-", began, True)
            return
        for slot in list(self._slots):  # the pool's actors hold CPUs the reservation needs
            if slot.running is None:
                self._replace(slot)
        node_cpus = max(int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n["Alive"])
        bundle: dict[str, float] = {"CPU": node_cpus}
        if self.total_gpus:
            bundle["GPU"] = 1
        group = placement_group([bundle], strategy="STRICT_PACK")
        requested = time.time()
        if not self._wait_for(group):
            remove_placement_group(group)
            group = None
        node = self._group_node(group)
        if self.announce is not None:
            self.announce(f"re-measuring the finalists on node {node}" if group is not None else
                          "re-measuring on a shared node: no node came free within "
                          f"{self.node_wait_s:.0f} s")
        session = _ExclusiveSession(self, group, bundle)
        began = time.time()
        try:
            yield session
        finally:
            session.close()
            if group is not None:
                remove_placement_group(group)
            self._record_phase(node, began, group is not None, requested)

    @contextlib.contextmanager
    def _pooled_exclusive(self) -> Iterator["_ExclusiveSession"]:
        """The service pool's timing worker of a node locked for this job: no other job's
        trial runs there meanwhile (tuner.execution.warm_pool). When no node comes free
        within ``node_wait_s``, the work runs on one of the job's own workers, shared."""
        requested = time.time()
        granted = self._lender.lock(self.node_wait_s, self.announce)
        if granted is None:
            if self.announce is not None:
                self.announce("re-measuring on a shared node: no node came free within "
                              f"{self.node_wait_s:.0f} s")
            self._fill_pool()
            session = _ExclusiveSession(self, None, {}, slot=self._screening()[0],
                                        exclusive=False)
        else:
            session = _ExclusiveSession(self, None, {}, slot=self._timing_slot(granted),
                                        exclusive=True, lender=self._lender)
            if self.announce is not None:
                self.announce(f"re-measuring the finalists on node {granted[2]} (warm timing "
                              "worker)")
        began = time.time()
        try:
            yield session
        finally:
            session.release()
            if granted is not None:
                for slot in [s for s in self._slots if s.timing]:
                    self._slots.remove(slot)
                self._lender.unlock()
            self._record_phase(granted[2] if granted else "-", began, granted is not None,
                               requested)

    def _timing_slot(self, granted: tuple) -> _Slot:
        import ray

        name, handle, _ = granted
        slot = _Slot(handle, ray.get(handle.node.remote(), timeout=_ACTOR_START_TIMEOUT_S),
                     name=name, timing=True)
        self._slots.append(slot)
        return slot

    def _wait_for(self, group) -> bool:
        """Wait up to ``node_wait_s`` for the reservation; after a few seconds say that the
        job waits for a node (another job is re-measuring there), instead of hanging silently."""
        import ray

        deadline = time.monotonic() + self.node_wait_s
        said = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                ray.get(group.ready(), timeout=min(left, 3.0))
                return True
            except ray.exceptions.GetTimeoutError:
                if not said and self.announce is not None:
                    self.announce("waiting for a node: the re-measurement needs a whole node "
                                  "to itself and every node is busy (other jobs)")
                    said = True

    @staticmethod
    def _group_node(group) -> str:
        if group is None:
            return "-"
        from ray.util.placement_group import placement_group_table

        nodes = placement_group_table(group).get("bundles_to_node_id", {})
        return str(next(iter(nodes.values()), "-"))

    def _record_phase(self, node: str, began: float, exclusive: bool,
                      requested: float | None = None) -> None:
        """``requested``: when the node was asked for; ``start``: when the job had it."""
        self.exclusive_phases.append({"node": node, "requested": round(requested or began, 3),
                                      "start": round(began, 3), "end": round(time.time(), 3),
                                      "exclusive": exclusive})

    def close(self) -> None:
        import ray

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

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class _ExclusiveSession:
    """Runs specs one at a time on one actor, each config on a model the actor keeps alive
    (``tuner.worker.live``); a crashed or hung actor is replaced by a fresh one (in the same
    reservation) and the session goes on. Closing it replaces the actor, models and all; a
    session on the pool's own actor (``slot``) releases its models instead."""

    def __init__(self, executor: RayExecutor, group, bundle: dict[str, float],
                 slot: _Slot | None = None, exclusive: bool | None = None,
                 lender: Lender | None = None) -> None:
        self._executor = executor
        self._lender = lender      # a warm timing worker: its successor comes from the keeper
        self._group = group
        self._bundle = bundle
        self._slot = slot
        self.exclusive_timing = group is not None if exclusive is None else exclusive

    def _ensure_actor(self) -> _Slot:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        executor = self._executor
        if self._slot is not None and self._slot in executor._slots:
            return self._slot
        if self._lender is not None:      # the timing worker crashed: the keeper replaced it
            granted = self._lender.lock(60.0, None)
            if granted is None:
                raise TrialInfrastructureError("the service's pool lost this job's node lock")
            self._slot = executor._timing_slot(granted)
            return self._slot
        if self._group is not None:
            (slot,) = executor._start_actors(
                1, num_cpus=self._bundle["CPU"], num_gpus=self._bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._group, placement_group_bundle_index=0))
        else:
            (slot,) = executor._start_actors(1, num_cpus=1)
        executor._slots.append(slot)
        self._slot = slot
        return slot

    def run(self, spec: TrialSpec, time_limit_s: float) -> TrialResult:
        executor = self._executor
        slot = self._ensure_actor()
        if executor.submissions is not None:
            executor.submissions.write(spec, "re-measurement")
        slot.ref = slot.actor.run_live.remote(executor._with_source(spec))
        slot.running, slot.started, slot.limit_s = spec.number, time.monotonic(), time_limit_s
        slot.overlapped = not self.exclusive_timing
        (result,) = executor.wait_any()
        return result

    def close(self) -> None:
        if self._slot is not None and self._slot in self._executor._slots:
            self._executor._replace(self._slot)
        self._slot = None

    def release(self) -> None:
        """Drop the live models, keep the actor (it is the pool's)."""
        import ray

        if self._slot is not None and self._slot in self._executor._slots:
            try:
                ray.get(self._slot.actor.release_live.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - the job's end kills the actor anyway
                pass
        self._slot = None
