"""One worker of the Ray pool as the driver sees it (``Slot``): its actor, its node, and the
trial it runs with its time limit. Plain bookkeeping shared by the pool (tuner.execution.ray_pool),
its actors' lifecycle (ray_lifecycle) and its exclusive sessions (ray_exclusive)."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.trial_types import TrialSpec

PLACEMENT_TIMEOUT_S = 120.0      # how long a job waits for a whole node to itself, by default
ACTOR_START_TIMEOUT_S = 600.0    # an actor's start: TensorFlow's import, on a busy node


@dataclass
class Slot:
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


