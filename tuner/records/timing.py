"""Where a tuning job's wall time went, measured phase by phase (driver side, plain data).

A job's wall time is split into phases timed on the driver's clock: start-up (the command, Ray,
the worker process and its TensorFlow import), the task check, the ceiling probe, the
diagnostics, opening the records (the run directory, the MLflow store and parent run, the
Optuna study), the search trials, the re-measurement, the workers' shutdown (Ray's, where it
runs), and the records and plots at the end; whatever no phase covers is "other". Inside the two
phases that run trials, the workers' own clocks say how the trials spent it: building the model
(task, data, build, compile), tracing the training step (its first call), the training steps, and
the rest of the worker's time; the driver adds the time it spent recording each trial (MLflow,
trials.jsonl). With parallel workers those parts are summed over trials, so they can exceed their
phase's wall time.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

# Phases in the order a job runs them.
PHASES = ("start-up", "task check", "ceiling probe", "diagnostics", "opening records", "trials",
          "re-measurement", "confirmation", "memory check", "shutdown", "records and plots")
# A precision whose ceiling is below this share of float32's speed cannot win on this device.
CANNOT_WIN_BELOW = 0.5


def _speeds(speed: dict[str, float], emulated: dict[str, float] | None = None) -> str:
    shown = [f"{dtype} {value:.2g}x" for dtype, value in speed.items() if dtype != "float32"]
    shown += [f"{dtype} {value:.2g}x (emulated)" for dtype, value in (emulated or {}).items()
              if dtype not in speed and dtype != "float32"]
    return ", ".join(shown)


def describe_ceiling(ceiling: dict[str, Any]) -> str:
    """``bfloat16 1.9x, float16 0.009x (emulated) float32's speed at the peak (a 1024-wide
    layer's training step, batch 1024, on CPU); at this model's largest layer (dense, batch
    128, 784x256): bfloat16 1.3x; the skip rule reads a 256-wide step: bfloat16 1.1x, float16
    0.009x; float16 cannot beat float32 on this device``. A run recorded before the peak
    figure existed reads as it did then (the 256-wide step alone)."""
    small = f"a {ceiling['size']}-wide dense layer's training step"
    if "peak" not in ceiling:
        text = f"{_speeds(ceiling['speed'])} float32's speed ({small} on {ceiling['device']})"
    else:
        peak = ceiling["peak"]
        text = (f"{_speeds(peak['speed'], ceiling['speed'])} float32's speed at the peak (a "
                f"{peak['size']}-wide layer's training step, batch {peak['size']}, on "
                f"{ceiling['device']})")
        model = ceiling.get("model")
        if model and len(model["speed"]) > 1:
            batch, width_in, width_out = model["shape"]
            text += (f"; at this model's largest layer ({model['layer']}, batch {batch}, "
                     f"{width_in}x{width_out}): {_speeds(model['speed'])}")
        text += f"; the skip rule reads {small.replace('dense layer', 'layer')}: " \
                f"{_speeds(ceiling['speed'])}"
    slow = [dtype for dtype, speed in ceiling["speed"].items() if speed < CANNOT_WIN_BELOW]
    if slow:
        text += f"; {' and '.join(slow)} cannot beat float32 on this device"
    if ceiling.get("kept_in"):
        text += (f" (the device's figures as measured on this machine at "
                 f"{ceiling.get('measured_at', '?')}, kept in {ceiling['kept_in']}: delete it "
                 "to measure them again)")
    elif ceiling.get("reused"):
        text += (" (the device's figures as this warm worker measured them before this job"
                 + (f", at {ceiling['measured_at']})" if ceiling.get("measured_at") else ")"))
    return text


def peak_speed(ceiling: dict[str, Any] | None, dtype: str) -> float | None:
    """The ceiling a pick computing in ``dtype`` is read against: the peak figure, or the small
    step's where the peak was not timed (an emulated dtype, an older run)."""
    if not ceiling:
        return None
    return (ceiling.get("peak") or {}).get("speed", {}).get(dtype, ceiling["speed"].get(dtype))


@dataclass
class WorkerTime:
    """What the worker clocks say about the runs of one phase."""

    runs: int = 0
    traces: int = 0           # runs that traced the training step (built a model)
    build_s: float = 0.0      # task, data, model build and compile, until the first step
    trace_s: float = 0.0      # the first step: tracing (and compiling) the training step; and
    #                           validation's first batch where it traces the test step
    train_s: float = 0.0      # the training steps after it
    validate_s: float = 0.0   # evaluating on the validation batches after the first
    #                           (tuner.worker.trial.validation)
    other_s: float = 0.0      # the rest of the run's wall time in the worker
    record_s: float = 0.0     # the driver recording the runs (MLflow, trials.jsonl)

    def add(self, result) -> None:
        self.runs += 1
        self.traces += result.trace_s > 0
        parts = run_parts(result)
        self.build_s += parts["build"]
        self.trace_s += parts["trace"]
        self.train_s += parts["train"]
        self.validate_s += parts["validate"]
        self.other_s += parts["other"]

    def describe(self) -> str:
        parts = [("build", self.build_s), ("trace", self.trace_s), ("train", self.train_s),
                 ("validate", self.validate_s), ("worker other", self.other_s),
                 ("records", self.record_s)]
        return ", ".join(f"{name} {seconds:.1f}" for name, seconds in parts if seconds >= 0.05)


def run_parts(result) -> dict[str, float]:
    """A run's worker time (a ``TrialResult``) by part: build; trace, the training step's
    first call and validation's first batch where it traced the test step
    (tuner.worker.trial.validation); train; validate, the rest of the validation; other."""
    validation = result.validation or {}
    validate_trace_s = validation.get("trace_seconds", 0.0)
    validate_s = validation.get("seconds", 0.0) - validate_trace_s
    trace_s = result.trace_s + validate_trace_s
    return {"build": result.setup_s, "trace": trace_s, "train": result.train_s,
            "validate": validate_s,
            "other": max(0.0, result.wall_s - result.setup_s - trace_s - result.train_s
                         - validate_s)}


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
