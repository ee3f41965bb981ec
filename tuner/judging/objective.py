"""What "best" means: speed (the default), memory, or a balance of the two.

- ``speed``: the fastest config whose gain over float32 is real (``tuner.judging.decision``).
- ``memory``: the stable config that needs the least training memory (``training_memory``:
  weights, gradients, optimizer state and activations, counted from the model's tensors).
  Configs that need the same memory go to the simpler one, then to the faster one.
- ``balanced``: the Pareto front of stable configs over (step time, training memory) — no
  config on it is both faster and smaller than another — and from it the fastest config whose
  memory is within ``memory_slack`` (default 10%) of the front's smallest. Step times here are
  the search's single runs, which drift about 15% from run to run: configs within that of the
  fastest eligible one are a tie, and a tie goes to the simpler config.

The pick is then re-measured against float32, so its speed is reported with an interval like
any other. Pure Python: plain configs and numbers in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tuner.apply.config import PrecisionConfig
from tuner.apply.vocabulary import Vocabulary
from tuner.judging.decision import complexity
from tuner.judging.noise import SEARCH_DRIFT

DEFAULT_MEMORY_SLACK = 0.10


class Objective(Vocabulary):
    """What "best" means. Every module asks it a question below instead of comparing names;
    the value is what run.json, MLflow and the CLI spell."""

    SPEED = "speed"
    MEMORY = "memory"
    BALANCED = "balanced"

    @property
    def uses_memory(self) -> bool:
        """Whether a trial needs a training-memory figure to be ranked (Optuna's value)."""
        return self is not Objective.SPEED

    @property
    def directions(self) -> int:
        """How many values Optuna minimizes: step time and memory under balanced."""
        return 2 if self is Objective.BALANCED else 1

    def study_values(self, step_ms: float, memory_bytes: float | None) -> float | list[float]:
        """What Optuna is told for a judged trial."""
        if self is Objective.SPEED:
            return step_ms
        if self is Objective.MEMORY:
            return float(memory_bytes)
        return [step_ms, float(memory_bytes)]

    @property
    def decided_by_speed(self) -> bool:
        """Whether the winner is the fastest finalist whose gain is real (tuner.judging.decision);
        otherwise the finalists come in this objective's order, timed for their intervals."""
        return self is Objective.SPEED

    @property
    def ranks_by_memory(self) -> bool:
        """Whether the least training memory wins (simplicity, then speed, break ties): then
        a config that would rank behind enough stable ones is not trained
        (``tuner.judging.worth_training``)."""
        return self is Objective.MEMORY

    @property
    def skips_slow_policies(self) -> bool:
        """Whether policies the device's ceiling says cannot beat float32 are left out."""
        return self is Objective.SPEED

    @property
    def stops_slow_trials(self) -> bool:
        """Whether a trial may be stopped as too slow (never when only memory counts)."""
        return self is not Objective.MEMORY

    @property
    def stops_only_when_dominated(self) -> bool:
        """Whether a slow trial is stopped only against a stable config of no more memory
        (``needs_no_more_memory``), which then dominates it (balanced)."""
        return self is Objective.BALANCED

    @property
    def shows_front(self) -> bool:
        """Whether the summary lists the Pareto front of step time and memory."""
        return self is Objective.BALANCED


@dataclass(frozen=True)
class Point:
    number: int
    config: PrecisionConfig
    step_ms: float
    memory_bytes: int

    def describe(self) -> str:
        return (f"#{self.number} {self.config.describe()}: {self.step_ms:.2f} ms/step, "
                f"{self.memory_bytes / 1e6:.3g} MB")


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """The points no other point beats on both step time and memory, smallest memory first."""
    front = [p for p in points
             if not any(q.step_ms <= p.step_ms and q.memory_bytes <= p.memory_bytes
                        and (q.step_ms < p.step_ms or q.memory_bytes < p.memory_bytes)
                        for q in points)]
    return sorted(front, key=lambda p: (p.memory_bytes, p.step_ms))


def pick(points: Sequence[Point], objective: Objective,
         memory_slack: float = DEFAULT_MEMORY_SLACK) -> tuple[Point, str]:
    """The chosen point for ``memory`` or ``balanced``, and one line saying why."""
    if not points:
        raise ValueError("no stable config with a step time and a memory figure")
    objective = Objective(objective)
    if objective is Objective.MEMORY:
        smallest = min(p.memory_bytes for p in points)
        same = [p for p in points if p.memory_bytes == smallest]
        chosen = min(same, key=lambda p: (complexity(p.config), p.step_ms))
        return chosen, (f"objective memory: the smallest training memory, "
                        f"{smallest / 1e6:.3g} MB"
                        + (f" (shared by {len(same)} configs: the simplest)"
                           if len(same) > 1 else ""))
    if objective is not Objective.BALANCED:
        raise ValueError(f"objective must be memory or balanced here. Received: {objective!r}")
    front = pareto_front(points)
    limit = front[0].memory_bytes * (1.0 + memory_slack)
    eligible = [p for p in front if p.memory_bytes <= limit]
    fastest = min(eligible, key=lambda p: p.step_ms)
    tied = [p for p in eligible if p.step_ms <= fastest.step_ms * SEARCH_DRIFT]
    chosen = min(tied, key=lambda p: (complexity(p.config), p.step_ms))
    why = (f"objective balanced: the fastest on the front within {memory_slack:.0%} of its "
           f"smallest memory ({front[0].memory_bytes / 1e6:.3g} MB)")
    if chosen is not fastest:
        why += (f"; #{fastest.number} was faster by less than a run's "
                f"{SEARCH_DRIFT - 1:.0%} drift, so the simpler #{chosen.number} wins")
    return chosen, why


def ranked(points: Sequence[Point], objective: Objective,
           memory_slack: float = DEFAULT_MEMORY_SLACK, count: int = 3) -> list[tuple[Point, str]]:
    """The first ``count`` choices by ``objective``, best first, each with its line: the pick,
    then the pick among the rest, and so on (the finalists a confirmation falls back on)."""
    left, order = list(points), []
    while left and len(order) < count:
        chosen, why = pick(left, objective, memory_slack)
        order.append((chosen, why))
        left = [p for p in left if p is not chosen]
    return order
