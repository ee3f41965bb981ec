"""The warm pool's bookkeeping, as plain data: which worker is lent to whom, which runs a
trial now, and which node is locked for a timed phase. No Ray here; the pool's keeper
(tuner.execution.warm_pool) holds one ``PoolBook`` and the workers' handles.

The rules:

- A worker is lent to one holder (a job's driver) at a time; ``borrow`` spreads a holder's
  workers across nodes, nodes with the most idle workers first.
- A lent worker runs a trial between ``begin`` and ``end``. ``begin`` is refused while another
  holder locks the worker's node, or waits to lock it (so a lock cannot be starved).
- ``lock`` gives a holder a node's timing worker (all of the node's threads) once no other
  holder runs a trial there: one timed phase per node at a time, nothing beside it.
- ``reap`` forgets holders whose driver is gone: their workers come back (the ones that were
  running are listed, to be replaced: their trial may still run), their locks are released.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

SLOT, TIMING = "slot", "timing"


@dataclass
class Worker:
    name: str
    node: str
    kind: str = SLOT
    holder: str | None = None
    running: bool = False
    overlapped: bool = False     # another trial ran on its node during its current one


@dataclass
class PoolBook:
    workers: dict[str, Worker] = field(default_factory=dict)
    locks: dict[str, str] = field(default_factory=dict)      # node -> holder timing there
    pending: dict[str, str] = field(default_factory=dict)    # node -> holder waiting to lock

    def add(self, name: str, node: str, kind: str = SLOT) -> None:
        self.workers[name] = Worker(name, node, kind)

    def remove(self, name: str) -> Worker | None:
        return self.workers.pop(name, None)

    def nodes(self) -> list[str]:
        return sorted({w.node for w in self.workers.values()})

    # -- lending ------------------------------------------------------------------------
    def borrow(self, holder: str, count: int) -> list[str]:
        """Up to ``count`` idle slot workers for ``holder``, spread over the nodes."""
        idle: dict[str, list[Worker]] = {}
        for worker in self.workers.values():
            if worker.kind == SLOT and worker.holder is None:
                idle.setdefault(worker.node, []).append(worker)
        lent: list[str] = []
        while len(lent) < count and any(idle.values()):
            for node in sorted(idle, key=lambda n: (n in self.locks, -len(idle[n]), n)):
                if idle[node] and len(lent) < count:
                    worker = idle[node].pop(0)
                    worker.holder = holder
                    lent.append(worker.name)
        return lent

    def give_back(self, holder: str, names: list[str]) -> None:
        for name in names:
            worker = self.workers.get(name)
            if worker is not None and worker.holder == holder:
                worker.holder, worker.running = None, False

    def lent_to(self, holder: str) -> list[str]:
        return [w.name for w in self.workers.values() if w.holder == holder]

    # -- running and locking ----------------------------------------------------------------
    def begin(self, holder: str, name: str) -> bool:
        """May ``holder`` start a trial on its worker ``name`` now?"""
        worker = self.workers.get(name)
        if worker is None or worker.holder != holder:
            return False
        if self.locks.get(worker.node, holder) != holder \
                or self.pending.get(worker.node, holder) != holder:
            return False
        others = [w for w in self.workers.values()
                  if w.node == worker.node and w.running and w is not worker]
        worker.running, worker.overlapped = True, bool(others)
        for other in others:
            other.overlapped = True
        return True

    def end(self, holder: str, name: str) -> bool:
        """The trial on ``name`` ended: did another trial run on its node meanwhile?"""
        worker = self.workers.get(name)
        if worker is None or worker.holder != holder:
            return True
        overlapped = worker.overlapped
        worker.running = worker.overlapped = False
        return overlapped

    def lock(self, holder: str) -> str | None:
        """The timing worker of a node locked for ``holder``; None while other holders still
        run trials on every candidate node (the holder then waits on one, which refuses new
        trials from others until the lock is granted)."""
        for node, owner in self.locks.items():
            if owner == holder:
                return self.timing_worker(node)
        candidates = [node for node in self.nodes()
                      if node not in self.locks and self.timing_worker(node)
                      and self.pending.get(node, holder) == holder]
        if not candidates:
            return None
        mine = {w.node for w in self.workers.values() if w.holder == holder}
        candidates.sort(key=lambda n: (self._busy_for_others(n, holder), n not in mine, n))
        node = candidates[0]
        if self._busy_for_others(node, holder):
            self.pending[node] = holder
            return None
        for other in [n for n, owner in self.pending.items() if owner == holder]:
            del self.pending[other]
        self.locks[node] = holder
        return self.timing_worker(node)

    def unlock(self, holder: str) -> None:
        for table in (self.locks, self.pending):
            for node in [n for n, owner in table.items() if owner == holder]:
                del table[node]

    def _busy_for_others(self, node: str, holder: str) -> int:
        return sum(w.node == node and w.running and w.holder != holder
                   for w in self.workers.values())

    def timing_worker(self, node: str) -> str | None:
        return next((w.name for w in self.workers.values()
                     if w.node == node and w.kind == TIMING), None)

    # -- holders that are gone -----------------------------------------------------------
    def reap(self, alive: Callable[[str], bool]) -> list[str]:
        """Forget every holder for which ``alive(holder)`` is false. Returns the workers that
        were running a trial for one of them (to be replaced)."""
        holders = {w.holder for w in self.workers.values() if w.holder} \
            | set(self.locks.values()) | set(self.pending.values())
        running: list[str] = []
        for holder in holders:
            if alive(holder):
                continue
            running += [n for n in self.lent_to(holder) if self.workers[n].running]
            self.give_back(holder, self.lent_to(holder))
            self.unlock(holder)
        return running

    # -- for `service status` --------------------------------------------------------------
    def table(self) -> list[dict]:
        """Per node: slot workers busy (running a trial), lent (to a job, between trials),
        idle; and the holder timing there."""
        rows = []
        for node in self.nodes():
            slots = [w for w in self.workers.values() if w.node == node and w.kind == SLOT]
            rows.append({"node": node, "slots": len(slots),
                         "busy": sum(w.running for w in slots),
                         "lent": sum(w.holder is not None and not w.running for w in slots),
                         "idle": sum(w.holder is None for w in slots),
                         "timing": self.locks.get(node) or "-",
                         "holders": sorted({w.holder for w in slots if w.holder})})
        return rows
