"""Where a tuning job's wall time went, measured phase by phase (driver side, plain data).

A job's wall time is split into phases timed on the driver's clock: start-up (the command, Ray,
the worker process and its TensorFlow import), the task check, the ceiling probe, the
diagnostics, opening the records (the run directory, the MLflow store and parent run, the
Optuna study), the search trials, the re-measurement, and the records and plots at the end;
whatever no phase covers is "other". Inside the two phases that run trials, the workers' own
clocks say how the trials spent it: building the model (task, data, build, compile), tracing the training step (its first
call), the training steps, and the rest of the worker's time; the driver adds the time it spent
recording each trial (MLflow, trials.jsonl). With parallel workers those parts are summed over
trials, so they can exceed their phase's wall time.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

# Phases in the order a job runs them.
PHASES = ("start-up", "task check", "ceiling probe", "diagnostics", "opening records", "trials",
          "re-measurement", "confirmation", "memory check", "records and plots")
# A precision whose ceiling is below this share of float32's speed cannot win on this device.
CANNOT_WIN_BELOW = 0.5


def describe_ceiling(ceiling: dict[str, Any]) -> str:
    """``bfloat16 1.10x, float16 0.009x float32 (a 256-wide dense layer's training step on
    CPU); float16 cannot beat float32 on this device``"""
    speeds = ", ".join(f"{dtype} {speed:.2g}x" for dtype, speed in ceiling["speed"].items()
                       if dtype != "float32")
    text = (f"{speeds} float32's speed (a {ceiling['size']}-wide dense layer's training step "
            f"on {ceiling['device']})")
    slow = [dtype for dtype, speed in ceiling["speed"].items() if speed < CANNOT_WIN_BELOW]
    if slow:
        text += f"; {' and '.join(slow)} cannot beat float32 on this device"
    return text


@dataclass
class WorkerTime:
    """What the worker clocks say about the runs of one phase."""

    runs: int = 0
    traces: int = 0           # runs that traced the training step (built a model)
    build_s: float = 0.0      # task, data, model build and compile, until the first step
    trace_s: float = 0.0      # the first step: tracing (and compiling) the training step
    train_s: float = 0.0      # the training steps after it
    validate_s: float = 0.0   # evaluating on the validation batches (tuner.worker.validation)
    other_s: float = 0.0      # the rest of the run's wall time in the worker
    record_s: float = 0.0     # the driver recording the runs (MLflow, trials.jsonl)

    def add(self, result) -> None:
        self.runs += 1
        self.traces += result.trace_s > 0
        self.build_s += result.setup_s
        self.trace_s += result.trace_s
        self.train_s += result.train_s
        validate_s = (result.validation or {}).get("seconds", 0.0)
        self.validate_s += validate_s
        self.other_s += max(0.0, result.wall_s - result.setup_s - result.trace_s - result.train_s
                            - validate_s)

    def describe(self) -> str:
        parts = [("build", self.build_s), ("trace", self.trace_s), ("train", self.train_s),
                 ("validate", self.validate_s), ("worker other", self.other_s), ("records", self.record_s)]
        return ", ".join(f"{name} {seconds:.1f}" for name, seconds in parts if seconds >= 0.05)


@dataclass
class TimeBreakdown:
    phases: dict[str, float] = field(default_factory=dict)
    workers: dict[str, WorkerTime] = field(
        default_factory=lambda: {"trials": WorkerTime(), "re-measurement": WorkerTime(),
                                 "confirmation": WorkerTime()})

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + max(0.0, seconds)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def carve(self, source: str, target: str, seconds: float) -> None:
        """Move ``seconds`` of ``source``'s time to ``target`` (a phase run inside another)."""
        seconds = min(max(0.0, seconds), self.phases.get(source, 0.0))
        if not seconds:
            return
        self.phases[source] = self.phases.get(source, 0.0) - seconds
        self.add(target, seconds)

    def other_s(self, wall_s: float) -> float:
        return max(0.0, wall_s - sum(self.phases.values()))

    def describe(self, wall_s: float) -> str:
        """One line: ``where the time went: start-up 9.8 s · task check 0.9 s · ...``"""
        parts = []
        for name in PHASES:
            if name not in self.phases:
                continue
            text = f"{name} {self.phases[name]:.1f} s"
            worker = self.workers.get(name)
            if worker is not None and worker.runs:
                text += f" ({worker.runs} runs, {worker.traces} traced: {worker.describe()})"
            parts.append(text)
        parts.append(f"other {self.other_s(wall_s):.1f} s")
        return "where the time went: " + " · ".join(parts)

    def to_dict(self, wall_s: float) -> dict[str, Any]:
        return {"wall_s": wall_s, "phases": dict(self.phases), "other_s": self.other_s(wall_s),
                "workers": {name: asdict(worker) for name, worker in self.workers.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TimeBreakdown":
        """Back from timing.json (``to_dict``)."""
        return cls(phases=dict(data["phases"]),
                   workers={name: WorkerTime(**worker)
                            for name, worker in data["workers"].items()})

    def metrics(self, wall_s: float) -> dict[str, float]:
        """Flat MLflow metrics: ``time_<phase>_s`` and ``time_<phase>_<part>_s``."""
        def key(name: str) -> str:
            return name.replace(" ", "_").replace("-", "_")

        flat = {f"time_{key(name)}_s": seconds for name, seconds in self.phases.items()}
        flat["time_other_s"] = self.other_s(wall_s)
        for name, worker in self.workers.items():
            for part in ("build_s", "trace_s", "train_s", "validate_s", "other_s", "record_s"):
                flat[f"time_{key(name)}_{part}"] = getattr(worker, part)
        return flat
