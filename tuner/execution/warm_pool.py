"""The tuning service's warm workers: TensorFlow processes kept alive between jobs.

``service start`` runs ``python -m tuner.execution.warm_pool start`` against its new cluster.
That leaves a detached, named Ray actor, the pool's keeper (``precision-tuner-pool``, no
TensorFlow in it), which starts and owns, on every CPU node:

- one *slot* worker per CPU (1 CPU each, TensorFlow on one thread): jobs screen on these;
- one *timing* worker (no CPU of its own, TensorFlow on all the node's threads): a job
  re-measures its finalists on it while it holds the node's lock, which the keeper grants
  only once no other job runs a trial there, and holds back other jobs' trials meanwhile.

Between them the slot workers hold every CPU of the node, so nothing outside the pool is
scheduled beside a timed phase, and the lock keeps the pool's own trials off it: the same
promise as the placement group a job without a pool reserves (tuner.execution.ray_pool).

At start, once all are warm, each slot worker times the device's ceiling (one at a time, on
the quiet node), so a job's first probe reuses it; a replacement worker times it at its first
job instead. A job's executor (``Lender``) borrows slot workers at its start and gives them
back at its end; the keeper then has them drop the job's task, batches and live models. A
worker that crashed or timed out is replaced by a fresh one. A job whose driver died
(killed, SIGKILL) is noticed at the next request: its workers come back, those that were
still running its trial are replaced, its lock is released. Nodes with GPUs are not pooled:
their jobs start their own workers, as without a service.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Callable

from tuner.execution.pool_keeper import KEEPER, NAMESPACE, keeper_class

_POLL_S = 0.5


# -- the job's side ------------------------------------------------------------------------
def find_keeper():
    """The service's pool keeper on the connected cluster, or None."""
    import ray

    try:
        return ray.get_actor(KEEPER, namespace=NAMESPACE)
    except ValueError:
        return None


class Lender:
    """A job's dealings with the keeper: ``holder`` names the job's driver (its job id, pid
    and host), so that the keeper can tell when it is gone."""

    def __init__(self, keeper, label: str) -> None:
        self.keeper = keeper
        self.holder = f"{label}|{os.getpid()}|{socket.gethostname()}"

    def borrow(self, count: int, announce: Callable[[str], None] | None) -> list[tuple]:
        """At least one and up to ``count`` warm workers, waiting while others hold all. A
        job waits as long as it takes, never failing for it: the service runs no more jobs
        at once than it has workers (its job turns, tuner.service.limits), and the keeper
        takes back the workers of a job whose driver died."""
        import ray

        said = False
        while True:
            lent = ray.get(self.keeper.borrow.remote(self.holder, count), timeout=60)
            if lent:
                return lent
            if not said and announce is not None:
                announce("waiting for a warm worker: other jobs hold all of the service's")
                said = True
            time.sleep(_POLL_S)

    def give_back(self, names: list[str]) -> None:
        import ray

        try:
            ray.get(self.keeper.give_back.remote(self.holder, names), timeout=30)
        except Exception:  # noqa: BLE001 - a keeper that is gone cannot lend them again anyway
            pass

    def begin(self, name: str, announce: Callable[[str], None] | None) -> None:
        """Wait until the keeper lets this job start a trial on ``name`` (another job may be
        timing on its node)."""
        import ray

        said = False
        while not ray.get(self.keeper.begin.remote(self.holder, name), timeout=60):
            if not said and announce is not None:
                announce("waiting: another job is timing its finalists on this node")
                said = True
            time.sleep(_POLL_S)

    def end(self, name: str) -> bool:
        """The trial on ``name`` ended; True when another trial (of any job) ran on its node
        meanwhile, so its timings were shared."""
        import ray

        try:
            return bool(ray.get(self.keeper.end.remote(self.holder, name), timeout=60))
        except Exception:  # noqa: BLE001 - cannot tell: count the timings as shared
            return True

    def lock(self, wait_s: float, announce: Callable[[str], None] | None) -> tuple | None:
        """A node's timing worker, locked for this job; None after ``wait_s``."""
        import ray

        deadline, said = time.monotonic() + wait_s, False
        while True:
            granted = ray.get(self.keeper.lock.remote(self.holder), timeout=60)
            if granted is not None or time.monotonic() > deadline:
                return granted
            if not said and announce is not None:
                announce("waiting for a node: the re-measurement needs a whole node to itself "
                         "and other jobs run trials on every node")
                said = True
            time.sleep(_POLL_S)

    def unlock(self) -> None:
        import ray

        try:
            ray.get(self.keeper.unlock.remote(self.holder), timeout=30)
        except Exception:  # noqa: BLE001 - a keeper that is gone holds no lock for anyone
            pass

    def replace(self, name: str) -> None:
        import ray

        try:
            ray.get(self.keeper.replace.remote(name), timeout=60)
        except Exception:  # noqa: BLE001 - a keeper that is gone lends the worker to no one
            pass


# -- `service start` / `service status` run these against the service's cluster -------------
def start(address: str, slots_per_node: int | None, wait_s: float) -> dict:
    """Create the keeper (detached, on this node) and its workers; wait up to ``wait_s`` for
    them to be warm (TensorFlow imported)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
             logging_level="WARNING")
    keeper = find_keeper()
    if keeper is None:
        keeper = keeper_class().options(
            name=KEEPER, namespace=NAMESPACE, lifetime="detached",
            scheduling_strategy=NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False)
        ).remote(slots_per_node)
    ray.get(keeper.fill.remote(), timeout=60)
    deadline = time.monotonic() + wait_s
    while True:
        state = ray.get(keeper.status.remote(), timeout=60)
        if not state["starting"] or time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    if not state["starting"]:     # nothing else runs yet: the probes are timed on a quiet node
        state["primed"] = ray.get(keeper.prime.remote(), timeout=max(60.0, wait_s))
    return state


def status(address: str) -> dict | None:
    import ray

    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
             logging_level="WARNING")
    keeper = find_keeper()
    if keeper is None:
        return None
    ray.get(keeper.fill.remote(), timeout=60)   # nodes that joined since; dead ones dropped
    return ray.get(keeper.status.remote(), timeout=60)


def describe(state: dict | None) -> list[str]:
    """``service status``'s lines for the pool."""
    if state is None:
        return ["  warm workers: none (the service was started with --warm-workers 0)"]
    lines = [f"  warm workers: {state['workers']} ({len(state['starting'])} starting)"]
    for row in state["rows"]:
        lines.append(f"    node {row['node'][:8]}: {row['slots']} slots: {row['busy']} busy, "
                     f"{row['lent']} lent between trials, {row['idle']} idle; timing: "
                     f"{row['timing'].split('|')[0]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner.execution.warm_pool",
                                     description="start or show the service's warm workers")
    parser.add_argument("action", choices=("start", "status"))
    parser.add_argument("--address", required=True)
    parser.add_argument("--slots", type=int, default=0, help="slot workers per node (0: CPUs)")
    parser.add_argument("--wait", type=float, default=120.0)
    args = parser.parse_args(argv)
    state = start(args.address, args.slots or None, args.wait) if args.action == "start" \
        else status(args.address)
    print(json.dumps(state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
