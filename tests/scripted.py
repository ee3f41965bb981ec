"""A scripted executor: trials return chosen results, so the search's decisions can be tested.

It satisfies ``tuner.executor.Executor`` like the local and Ray executors do. A ``Machine``
describes the pretend hardware: each config's true step time, the run-to-run drift and step
jitter of a shared 2-core box, and (optionally) a penalty on the first run of a fresh worker.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuner.config import PrecisionConfig
from tuner.plan import Remeasurement, RunPlan
from tuner.proposer import Proposer
from tuner.scheduler import Scheduler
from tuner.space import load_space
from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec


@dataclass
class Machine:
    step_ms: Callable[[PrecisionConfig], float]      # true median step time of a config
    drift: float = 0.05                              # run-to-run spread (sigma, relative)
    jitter: float = 0.03                             # step-to-step spread within a run
    first_run_penalty: float = 1.0                   # a fresh worker's first run is slower
    seed: int = 0
    fail: Callable[[PrecisionConfig, TrialSpec, bool], TrialResult | None] = \
        lambda config, spec, exclusive: None
    memory: Callable[[PrecisionConfig], int] | None = None  # training memory of a config
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def run(self, spec: TrialSpec, *, exclusive: bool, first: bool) -> TrialResult:
        config = PrecisionConfig.from_dict(spec.config)
        failed = self.fail(config, spec, exclusive)
        if failed is not None:
            return failed
        scale = self.step_ms(config) * self.rng.lognormvariate(0.0, self.drift)
        if first:
            scale *= self.first_run_penalty
        times = [scale * 5.0] + [scale * self.rng.lognormvariate(0.0, self.jitter)
                                 for _ in range(spec.steps - 1)]
        losses = [2.0 * 0.95**i + self.rng.gauss(0.0, 0.002) for i in range(spec.steps)]
        memory = None
        if self.memory is not None:
            total = self.memory(config)
            memory = {"weights": {}, "gradients": {}, "optimizer": {},
                      "activations": {"float32": total}, "total_bytes": total}
        return TrialResult(number=spec.number, outcome=TrialOutcome.COMPLETED, losses=losses,
                           step_times_ms=times, loss_scales=[None] * spec.steps,
                           warmup_steps=spec.warmup_steps, train_s=sum(times[1:]) / 1000,
                           trace_s=times[0] / 1000, training_memory=memory)


class ScriptedExecutor:
    def __init__(self, machine: Machine, slots: int = 1) -> None:
        self.machine = machine
        self.slots = slots
        self.submitted: list[TrialSpec] = []       # every spec, search and re-measure
        self.remeasured: list[int] = []            # trial numbers run in exclusive sessions
        self._pending: list[TrialSpec] = []

    def probe(self, task_path: str, steps: int, timeout_s: float = 0) -> dict:
        return {}

    def diagnose(self, task_path: str, steps: int = 3, timeout_s: float = 0) -> dict:
        return {}

    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, spec: TrialSpec, time_limit_s: float) -> None:
        self.submitted.append(spec)
        self._pending.append(spec)

    def wait_any(self) -> list[TrialResult]:
        if not self._pending:
            return []
        spec = self._pending.pop(0)
        return [self.machine.run(spec, exclusive=False, first=False)]

    @contextlib.contextmanager
    def exclusive(self):
        yield _Session(self)

    def close(self) -> None:
        pass


class _Session:
    exclusive_timing = True

    def __init__(self, executor: ScriptedExecutor) -> None:
        self.executor = executor
        self.first = True

    def run(self, spec: TrialSpec, time_limit_s: float) -> TrialResult:
        self.executor.submitted.append(spec)
        self.executor.remeasured.append(spec.number)
        result = self.executor.machine.run(spec, exclusive=True, first=self.first)
        self.first = False
        return result


class Records:
    """TrialRecords that keep everything in memory."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.finished: list = []

    def trial_started(self, number, config, optuna_number, repair) -> None:
        self.started.append(number)

    def trial_finished(self, row, baseline_ms) -> None:
        self.finished.append(row)


def space_file(tmp_path: Path, text: str, name: str = "space"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_space(str(path))


def scheduler_for(space, executor, tmp_path: Path, *, trials: int, exhaustive: bool = False,
                  min_gain: float = 0.03, seed: int = 0, finalists: int = 3,
                  remeasurement: Remeasurement | None = None, objective: str = "speed",
                  memory_slack: float = 0.10) -> Scheduler:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    plan = RunPlan(task_path=tmp_path / "task.py", run_dir=tmp_path / "run", space=space,
                   space_ref=space.name, trials=space.size() if exhaustive else trials,
                   steps=20, seed=seed, tolerance=0.9, exhaustive=exhaustive,
                   tracking_uri=None, resume=False, finalists=finalists, min_gain=min_gain,
                   remeasurement=remeasurement or Remeasurement(time_cap_s=1e9),
                   objective=objective, memory_slack=memory_slack)
    study = optuna.create_study(directions=["minimize"] * (2 if objective == "balanced" else 1),
                                sampler=optuna.samplers.TPESampler(seed=seed,
                                                                   n_startup_trials=4))
    proposer = Proposer(space, study, enumerate_space=plan.enumerates_space,
                        objective=objective)
    return Scheduler(plan, executor, proposer, Records())
