"""A scripted executor: trials return chosen results, so the search's decisions can be tested.

It derives from ``tuner.execution.base.Executor`` like the local and Ray executors do. A ``Machine``
describes the pretend hardware: each config's true step time, the run-to-run drift and step
jitter of a shared 2-core box, and (optionally) a penalty on the first run of a fresh worker.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuner.apply.config import PrecisionConfig
from tuner.execution.base import Executor
from tuner.judging.early_stop import time_bound_reached, too_slow_reason
from tuner.judging.objective import Objective
from tuner.run.plan import Learned, Remeasurement, RunPlan
from tuner.run.trial_loop import Scheduler
from tuner.search.proposer import Proposer
from tuner.search.space_files import load_space
from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec


@dataclass
class Machine:
    step_ms: Callable[[PrecisionConfig], float]      # true median step time of a config
    drift: float = 0.05                              # run-to-run spread (sigma, relative)
    jitter: float = 0.03                             # step-to-step spread within a run
    first_run_penalty: float = 1.0                   # a fresh worker's first run is slower
    # The level a tune finds the 16-bit configs at: drawn once per machine (one tune) as
    # lognormal(0, level_drift) on their step time, alike in all its runs, so its rounds
    # cannot see it (the minute-to-minute move tuner.judging.noise's RUN_DRIFT_SD allows for).
    level_drift: float = 0.0
    seed: int = 0
    fail: Callable[[PrecisionConfig, TrialSpec, bool], TrialResult | None] = \
        lambda config, spec, exclusive: None
    memory: Callable[[PrecisionConfig], int] | None = None  # training memory of a config
    # The validation loss of a config's model after it has trained ``steps`` steps in all
    # (None: its evaluate raises).
    val_loss: Callable[[PrecisionConfig, int], float] | None = \
        lambda config, steps: 0.5 + 1.0 / (1.0 + steps / 50.0)   # None: evaluate fails
    # Added to a config's training losses once its model has trained ``steps`` steps before
    # this run (a config that trains to a worse level later on).
    train_offset: Callable[[PrecisionConfig, int], float] = lambda config, steps: 0.0
    rng: random.Random = field(init=False)
    level: float = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.level = random.Random(self.seed + 10_000).lognormvariate(0.0, self.level_drift)

    def run(self, spec: TrialSpec, *, exclusive: bool, first: bool,
            trained: int = 0) -> TrialResult:
        """One run of ``spec``; ``trained``: steps its (live) model trained before."""
        config = PrecisionConfig.from_dict(spec.config)
        failed = self.fail(config, spec, exclusive)
        if failed is not None:
            return failed
        steps = spec.steps if spec.train_to is None else max(0, spec.train_to - trained)
        scale = self.step_ms(config) * self.rng.lognormvariate(0.0, self.drift)
        if config.policy != "float32":
            scale *= self.level
        if first:
            scale *= self.first_run_penalty
        times = ([scale * 5.0] if steps else []) + [
            scale * self.rng.lognormvariate(0.0, self.jitter) for _ in range(steps - 1)]
        losses = [2.0 * 0.95**i + self.train_offset(config, trained) + self.rng.gauss(0.0, 0.002)
                  for i in range(steps)]
        memory, memory_error = None, ""
        if self.memory is not None and self.memory(config) is None:   # the count failed
            memory_error = "TypeError: an eager call of the model raised"
        elif self.memory is not None:
            total = self.memory(config)
            memory = {"weights": {}, "gradients": {}, "optimizer": {},
                      "activations": {"float32": total}, "total_bytes": total}
        validation = None
        if spec.validate and self.val_loss is None:
            validation = {"error": "model.evaluate raised ValueError: no test_step",
                          "source": "val_data"}
        elif spec.validate and self.val_loss(config, trained + steps) is None:
            validation = {"error": "model.evaluate raised InvalidArgumentError: cannot compute "
                                   "Mean as input #1 was expected to be a half tensor",
                          "source": "val_data"}
        elif spec.validate:
            loss = self.val_loss(config, trained + steps)
            batch_losses = [loss * (1.0 + 0.02 * (i - 3.5) / 3.5) for i in range(8)]
            validation = {"loss": loss, "batch_losses": batch_losses, "metrics": {},
                          "batches": 8, "samples": 64, "source": "val_data", "seconds": 0.0}
        result = TrialResult(number=spec.number, outcome=TrialOutcome.COMPLETED, losses=[],
                             step_times_ms=[], loss_scales=[], warmup_steps=spec.warmup_steps,
                             training_memory=memory, memory_error=memory_error)
        for step, (elapsed, loss) in enumerate(zip(times, losses)):
            result.step_times_ms.append(elapsed)
            result.losses.append(loss)
            result.loss_scales.append(None)
            # The worker's own early stop (tuner.judging.early_stop), on the limit the spec carries.
            reason = too_slow_reason(result, spec, step, elapsed)
            if reason:
                result.outcome, result.stop_reason = TrialOutcome.STOPPED_SLOW, reason
                validation = None
                break
            result.train_s = sum(result.step_times_ms[1:]) / 1000
            if time_bound_reached(result, spec):
                break
        done = len(result.step_times_ms)
        result.train_s = sum(result.step_times_ms[1:]) / 1000
        result.trace_s = times[0] / 1000 if times else 0.0
        result.validation, result.trained_steps = validation, trained + done
        return result


class ScriptedExecutor(Executor):
    def __init__(self, machine: Machine, slots: int = 1) -> None:
        self.machine = machine
        self.slots = slots
        self.submitted: list[TrialSpec] = []       # every spec, search and re-measure
        self.remeasured: list[int] = []            # trial numbers run in exclusive sessions
        self._pending: list[TrialSpec] = []

    def probe(self, task_path: str, steps: int, patterns=(), timeout_s: float = 0,
              ceiling: bool = False, diagnose_steps: int = 0) -> dict:
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
        self.trained: dict[int, int] = {}   # trial number -> steps its live model trained

    def run(self, spec: TrialSpec, time_limit_s: float) -> TrialResult:
        self.executor.submitted.append(spec)
        self.executor.remeasured.append(spec.number)
        result = self.executor.machine.run(spec, exclusive=True, first=self.first,
                                           trained=self.trained.get(spec.number, 0))
        self.first = False
        if result.trained_steps is not None:
            self.trained[spec.number] = result.trained_steps
        return result


class Records:
    """TrialRecords that keep everything in memory."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.finished: list = []
        self.released: list[dict] = []

    def trial_started(self, number, config, optuna_number, repair) -> None:
        self.started.append(number)

    def live_models_released(self, event) -> None:
        self.released.append(event)

    def trial_finished(self, row, baseline_ms) -> None:
        self.finished.append(row)


def space_file(tmp_path: Path, text: str, name: str = "space"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_space(str(path))


def scheduler_for(space, executor, tmp_path: Path, *, trials: int, exhaustive: bool = False,
                  min_gain: float = 0.03, seed: int = 0, finalists: int = 3,
                  remeasurement: Remeasurement | None = None, objective: str = "speed",
                  memory_slack: float = 0.10, run_drift: float = 0.0,
                  emulated: dict[str, float] | None = None,
                  ceiling: dict | None = None) -> Scheduler:
    """``ceiling``: the device's figures the plan is fitted to (``RunPlan.within_ceiling``), as
    a job fits it after the task check; None: the plan as given."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    objective = Objective(objective)
    plan = RunPlan(task_path=tmp_path / "task.py", run_dir=tmp_path / "run", space=space,
                   space_ref=space.name, trials=space.size() if exhaustive else trials,
                   steps=20, seed=seed, tolerance=0.9, exhaustive=exhaustive,
                   tracking_uri=None, resume=False, finalists=finalists, min_gain=min_gain,
                   remeasurement=remeasurement or Remeasurement(time_cap_s=1e9),
                   objective=objective, memory_slack=memory_slack, run_drift=run_drift,
                   learned=Learned(emulated=emulated or {}, ceiling_device="CPU"))
    if ceiling is not None:
        plan, _ = plan.within_ceiling(ceiling)
        space = plan.space
    study = optuna.create_study(directions=["minimize"] * objective.directions,
                                sampler=optuna.samplers.TPESampler(seed=seed,
                                                                   n_startup_trials=4))
    proposer = Proposer(space, study, enumerate_space=plan.enumerates_space,
                        objective=objective)
    return Scheduler(plan, executor, proposer, Records())
