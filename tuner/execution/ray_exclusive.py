"""Exclusive timing on Ray (``ExclusiveTiming``, mixed into tuner.execution.ray_pool.RayExecutor):
the finalists are re-measured on one actor with a whole node to itself, a placement group
reserving every CPU (or the service pool's timing worker on a node locked for the job), so no
other Ray work shares it. ``ExclusiveSession`` runs specs there one at a time on models the
actor keeps alive; a crash costs that run only, the session goes on on a fresh actor. When no
node comes free within ``node_wait_s``, the work runs anyway and says its timings were shared.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

from tuner.errors import TrialInfrastructureError
from tuner.execution.ray_slots import ACTOR_START_TIMEOUT_S, Slot
from tuner.execution.warm_pool import Lender
from tuner.trial_types import TrialResult, TrialSpec


class ExclusiveTiming:
    """The pool's exclusive sessions; the pool keeps ``_slots``, ``_lender``, ``workers``,
    ``announce``, ``node_wait_s`` and ``exclusive_phases``."""

    @contextlib.contextmanager
    def exclusive(self) -> Iterator["ExclusiveSession"]:
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
            # model alive (tuner.worker.trial.live). No reservation, no fresh process.
            session = ExclusiveSession(self, None, {}, slot=self._slots[0], exclusive=True)
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
        session = ExclusiveSession(self, group, bundle)
        began = time.time()
        try:
            yield session
        finally:
            session.close()
            if group is not None:
                remove_placement_group(group)
            self._record_phase(node, began, group is not None, requested)

    @contextlib.contextmanager
    def _pooled_exclusive(self) -> Iterator["ExclusiveSession"]:
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
            session = ExclusiveSession(self, None, {}, slot=self._screening()[0],
                                        exclusive=False)
        else:
            session = ExclusiveSession(self, None, {}, slot=self._timing_slot(granted),
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

    def _timing_slot(self, granted: tuple) -> Slot:
        import ray

        name, handle, _ = granted
        slot = Slot(handle, ray.get(handle.node.remote(), timeout=ACTOR_START_TIMEOUT_S),
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


class ExclusiveSession:
    """Runs specs one at a time on one actor, each config on a model the actor keeps alive
    (``tuner.worker.trial.live``); a crashed or hung actor is replaced by a fresh one (in the same
    reservation) and the session goes on. Closing it replaces the actor, models and all; a
    session on the pool's own actor (``slot``) releases its models instead."""

    def __init__(self, executor, group, bundle: dict[str, float],
                 slot: Slot | None = None, exclusive: bool | None = None,
                 lender: Lender | None = None) -> None:
        self._executor = executor
        self._lender = lender      # a warm timing worker: its successor comes from the keeper
        self._group = group
        self._bundle = bundle
        self._slot = slot
        self.exclusive_timing = group is not None if exclusive is None else exclusive

    def _ensure_actor(self) -> Slot:
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
