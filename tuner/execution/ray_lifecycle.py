"""What happens to the Ray pool's actors when a trial ends badly (``ActorLifecycle``, mixed into
tuner.execution.ray_pool.RayExecutor): a result collected, an actor that died (crashed, killed
for memory) failing that trial only and replaced, a node lost from the cluster re-queueing its
trial for a surviving node, a trial past its limit killed as a timeout. Ray never retries a
trial itself (``max_restarts=0``, ``max_task_retries=0``)."""

from __future__ import annotations

import time

from tuner.errors import first_line
from tuner.execution.ray_slots import Slot
from tuner.trial_types import FailureClass, TrialResult


class ActorLifecycle:
    """The pool's failure handling; the pool keeps ``_slots``, ``_lender``, ``_requeued``,
    ``workers`` and ``node_losses``."""

    def _collect(self, slot: Slot) -> TrialResult | None:
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

    def _node_lost(self, slot: Slot) -> bool:
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

    def _timeout(self, slot: Slot) -> TrialResult:
        if slot.name is not None and not slot.timing:
            self._lender.end(slot.name)
        result = self._failed(slot, FailureClass.TIMEOUT,
                              f"trial exceeded its time limit of {slot.limit_s:.0f} s; worker "
                              "killed")
        self._replace(slot)
        slot.running = slot.ref = None
        return result

    def _failed(self, slot: Slot, failure: FailureClass, message: str) -> TrialResult:
        result = TrialResult.failed(slot.running, failure, message, node=slot.node)
        result.wall_s = time.monotonic() - slot.started
        return result

    def _replace(self, slot: Slot) -> None:
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
