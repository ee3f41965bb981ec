"""The warm pool's keeper: a detached, named Ray actor (no TensorFlow in it) holding the
pool's book (tuner.execution.pool_book) and its workers' handles; tuner.execution.warm_pool
says what the pool is for and how jobs use it."""

from __future__ import annotations

import os
import socket

from tuner.execution.pool_book import SLOT, TIMING, PoolBook
from tuner.execution.ray_actor import trial_actor_class

NAMESPACE = "precision-tuner"
KEEPER = "precision-tuner-pool"


def keeper_class():
    """``PoolKeeper`` as a Ray actor class (no CPU of its own, never restarted)."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(PoolKeeper)


class PoolKeeper:
    """The book of the pool and the handles of its workers (see the module's text)."""

    def __init__(self, slots_per_node: int | None) -> None:
        self._slots_per_node = slots_per_node
        self._book = PoolBook()
        self._handles: dict[str, object] = {}
        self._warming: dict[str, object] = {}    # name -> the ref of its first answer
        self._count = 0
        self._host = socket.gethostname()
        self._actor_class = trial_actor_class()

    # -- the workers -------------------------------------------------------------
    def fill(self) -> int:
        """Start the workers missing on every live CPU node; forget dead nodes'."""
        import ray

        alive = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        for name in [w.name for w in self._book.workers.values() if w.node not in alive]:
            self._forget(name)
        started = 0
        for node_id, node in alive.items():
            resources = node.get("Resources", {})
            cpus = int(resources.get("CPU", 0))
            if cpus < 1 or resources.get("GPU"):
                continue
            have = [w for w in self._book.workers.values() if w.node == node_id]
            wanted = self._slots_per_node or cpus
            for _ in range(wanted - sum(w.kind == SLOT for w in have)):
                self._start(node_id, SLOT, 1, 1)
                started += 1
            if not any(w.kind == TIMING for w in have):
                self._start(node_id, TIMING, 0, cpus)
                started += 1
        return started

    def _start(self, node_id: str, kind: str, cpus: int, threads: int) -> str:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._count += 1
        name = f"pt-warm-{node_id[:8]}-{kind}-{self._count}"
        handle = self._actor_class.options(
            name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=cpus,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote(threads, False)
        self._handles[name] = handle
        self._warming[name] = handle.node.remote()
        self._book.add(name, node_id, kind)
        return name

    def _forget(self, name: str) -> None:
        import ray

        handle = self._handles.pop(name, None)
        self._warming.pop(name, None)
        self._book.remove(name)
        if handle is not None:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - it may be gone already
                pass

    def replace(self, name: str) -> None:
        """A worker that crashed, hung or timed out: killed, a fresh one in its place."""
        import ray

        worker = self._book.workers.get(name)
        if worker is None:
            return
        node, kind = worker.node, worker.kind
        self._forget(name)
        alive = [n for n in ray.nodes() if n["NodeID"] == node and n["Alive"]]
        if alive:                 # a worker of a node that is gone is not replaced there
            threads = 1 if kind == SLOT else int(alive[0]["Resources"].get("CPU", 1))
            self._start(node, kind, 1 if kind == SLOT else 0, threads)

    def prime(self, timeout_s: float = 60.0) -> dict[str, float]:
        """Have each warm, idle slot worker time the device's ceiling figures
        (tuner.worker.device.ceiling.prime), one worker at a time so that no probe runs beside
        another: a job's first probe then reuses them instead of timing them before its first
        trial. Seconds per worker; a worker that fails here is left to fail at its job."""
        import ray

        spent = {}
        for name, worker in sorted(self._book.workers.items()):
            if worker.kind != SLOT or worker.holder is not None or name not in self._handles:
                continue
            try:
                spent[name] = ray.get(self._handles[name].prime_ceiling.remote(),
                                      timeout=timeout_s)
            except Exception:  # noqa: BLE001 - its job's own call reports a broken worker
                continue
        return spent

    # -- lending ------------------------------------------------------------------
    def _reap(self) -> None:
        for name in self._book.reap(self._holder_alive):
            self.replace(name)

    def _holder_alive(self, holder: str) -> bool:
        _, pid, host = holder.rsplit("|", 2)
        if host != self._host:
            return True           # a driver elsewhere: it gives its workers back itself
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except (PermissionError, ValueError):
            pass
        return True

    def _lent(self, names: list[str]) -> list[tuple]:
        return [(n, self._handles[n], self._book.workers[n].node) for n in names]

    def borrow(self, holder: str, count: int) -> list[tuple]:
        """Once per job: the pool first follows the cluster (workers for nodes that joined,
        none left on nodes that are gone), so no worker of a dead node is lent."""
        self._reap()
        self.fill()
        return self._lent(self._book.borrow(holder, count))

    def give_back(self, holder: str, names: list[str]) -> None:
        for name in names:
            if name in self._handles and self._book.workers[name].holder == holder:
                self._handles[name].forget.remote()
        self._book.give_back(holder, names)

    def begin(self, holder: str, name: str) -> bool:
        return self._book.begin(holder, name)

    def end(self, holder: str, name: str) -> bool:
        return self._book.end(holder, name)

    def lock(self, holder: str) -> tuple | None:
        self._reap()
        name = self._book.lock(holder)
        return None if name is None else self._lent([name])[0]

    def unlock(self, holder: str) -> None:
        for node, owner in list(self._book.locks.items()):
            if owner == holder:
                name = self._book.timing_worker(node)
                if name in self._handles:
                    self._handles[name].forget.remote()
        self._book.unlock(holder)

    def status(self) -> dict:
        import ray

        self._reap()
        ready, _ = ray.wait(list(self._warming.values()),
                            num_returns=len(self._warming), timeout=0) \
            if self._warming else ([], [])
        warm = {name for name, ref in self._warming.items() if ref in ready}
        return {"rows": self._book.table(),
                "starting": sorted(set(self._warming) - warm),
                "workers": len(self._book.workers)}
