"""What crosses the process boundary: a trial spec in, a trial result out. Plain data only.

Both are dataclasses of builtins (str, int, float, list, dict, None), picklable and convertible
with ``to_dict``/``from_dict``, so a trial can run in this process, a subprocess or a Ray actor.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any


class TrialOutcome(str, enum.Enum):
    """How a trial run ended, before any verdict (mapped to Optuna states in
    tuner.search.proposer)."""

    COMPLETED = "completed"   # trained the whole budget (losses may still be non-finite)
    DIVERGED = "diverged"     # stopped early: loss became non-finite
    STOPPED_SLOW = "stopped_slow"  # stopped early: clearly slower than the best stable trial
    FAILED = "failed"         # an error prevented training (see FailureClass)


class FailureClass(str, enum.Enum):
    """Why a trial could not train (a non-finite loss is not a failure: see DIVERGED)."""

    DTYPE_MISMATCH = "dtype_mismatch"
    INTEGER_ROUNDING = "integer_rounding"  # integer-valued floats beyond the 16-bit exact range
    INPUT_ROUNDING = "input_rounding"  # a continuous feature that 16-bit rounding erases
    INDEX_OUT_OF_RANGE = "index_out_of_range"  # a gather/lookup index outside its table
    NUMERIC_CHECK = "numeric_check"  # the model's own check_numerics found NaN or Inf
    OUT_OF_MEMORY = "out_of_memory"
    TASK_ERROR = "task_error"        # the user's task code raised (build_model, data, ...)
    # The config's 16-bit dtype computes (almost) none of the model (tuner.apply.reach): the
    # trial would measure float32, so it is not ranked as a 16-bit config.
    PRECISION_UNREACHED = "precision_unreached"
    WORKER_CRASHED = "worker_crashed"
    TIMEOUT = "timeout"
    OTHER = "other"


@dataclass
class TrialSpec:
    """Everything a worker needs to run one trial."""

    number: int
    task_path: str
    config: dict[str, Any]            # PrecisionConfig.to_dict()
    steps: int
    warmup_steps: int
    seed: int = 0
    stop_if_slower_than_ms: float | None = None  # early stop when median step time exceeds it
    # Layers that take integer-valued floats (diagnostics' ``integer_inputs``): checked for
    # 16-bit rounding before the trial trains.
    integer_inputs: list[dict[str, Any]] = field(default_factory=list)
    # Layers that take continuous features a 16-bit cast erases (diagnostics'
    # ``continuous_inputs``): checked the same way.
    continuous_inputs: list[dict[str, Any]] = field(default_factory=list)
    # Keep the trained model alive in the worker for the re-measurement (tuner.worker.trial.live).
    keep_live: bool = False
    # tuner.judging.sizing.Sizing.to_dict(): train past ``steps`` until the timing and the loss
    # comparison are precise enough (the float32 baseline of a run without --steps).
    sizing: dict[str, Any] | None = None
    # How many of the task's batches the run cycles through (None: ``steps``). Every trial of
    # a run uses the same pool, so all see the same data in the same order.
    batch_pool: int | None = None
    # End the run with an evaluation on the run's fixed validation batches (every search
    # trial; the confirmation's runs).
    validate: bool = False
    # A live model's run trains until the model has trained this many steps in all (the
    # confirmation brings float32 and the pick to the same step counts); None: ``steps`` more.
    train_to: int | None = None
    # Train at most this many seconds (after the traced first step), never fewer than
    # ``time_bound_min_steps`` steps: a trial far slower than the float32 baseline is judged
    # on the steps it trained in that time, not on the full count (None: no bound).
    time_bound_s: float | None = None
    time_bound_min_steps: int = 0
    # float32's products in IEEE float32, TF32 off (--strict-float32; tuner.worker.device.tf32).
    strict_float32: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialSpec":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class TrialResult:
    """What one trial measured. Lists are per training step, in order."""

    number: int
    outcome: TrialOutcome
    losses: list[float] = field(default_factory=list)
    step_times_ms: list[float] = field(default_factory=list)
    loss_scales: list[float | None] = field(default_factory=list)   # after each step
    initial_loss_scale: float | None = None   # the scale before the first step
    skipped_steps: int = 0
    skipped: list[int] = field(default_factory=list)   # which steps the loss scaler skipped
    loss_scale_kind: str = "none"   # the config's: a fixed scale cannot back off or collapse
    first_non_finite_step: int | None = None
    failure_class: FailureClass | None = None
    failure_message: str = ""
    failure_layer: str | None = None
    stop_reason: str = ""     # why the worker stopped early (too slow), with the numbers
    sized_by: str = ""        # a sized run: why it stopped where it did (tuner.judging.sizing)
    time_bounded_s: float | None = None  # stopped at its spec's time bound (that many seconds)
    # What training needs, counted from the model's tensors (tuner.worker.trial.memory).
    training_memory: dict[str, Any] | None = None
    memory_error: str = ""    # why training_memory could not be counted
    warmup_steps: int = 0
    batch_size: int | None = None
    weights_bytes: int | None = None     # bytes of all model weights (shows 16-bit savings)
    peak_memory_bytes: int | None = None  # GPU peak, or host RSS growth during the trial
    memory_source: str = ""
    # The memory its worker had left right after it, with what it kept alive held
    # (tuner.worker.device.room: source, free_bytes, held_bytes, rss_bytes).
    device_room: dict[str, Any] | None = None
    setup_s: float = 0.0      # import/build/compile of this trial, outside training steps
    trace_s: float = 0.0      # the first step: tracing (and compiling) the training step
    train_s: float = 0.0      # wall time inside the training steps after the first
    wall_s: float = 0.0       # whole trial on the worker
    node: str = ""
    exclusive_timing: bool = True
    # The evaluation on the validation batches (tuner.worker.trial.validation): loss, per-batch
    # losses, metrics, source; None when the run did not validate.
    validation: dict[str, Any] | None = None
    trained_steps: int | None = None   # a live model: the steps it has trained in all
    # Each loss the train_step returns, per step, where it returns more than ``loss`` alone
    # (a GAN's d_loss and g_loss); ``losses`` then holds ``loss``, or their sum.
    loss_terms: dict[str, list[float]] = field(default_factory=dict)
    # How much of the model computed in the config's 16-bit dtype (tuner.apply.reach): the
    # parameters by compute dtype, their share, the activations' share, the layers elsewhere.
    precision_reach: dict[str, Any] | None = None
    # With more than one optimizer (compile_model): each one's ``name``, ``initial_loss_scale``,
    # ``loss_scales`` (after each step) and ``skipped`` steps.
    optimizers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def timed_steps_ms(self) -> list[float]:
        """Step times after warm-up (tracing and first-step effects excluded)."""
        return self.step_times_ms[self.warmup_steps:]

    @property
    def median_step_ms(self) -> float | None:
        timed = sorted(self.timed_steps_ms)
        if not timed:
            return None
        middle = len(timed) // 2
        return timed[middle] if len(timed) % 2 else (timed[middle - 1] + timed[middle]) / 2

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        data["failure_class"] = self.failure_class.value if self.failure_class else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialResult":
        kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        kwargs["outcome"] = TrialOutcome(kwargs["outcome"])
        if kwargs.get("failure_class"):
            kwargs["failure_class"] = FailureClass(kwargs["failure_class"])
        return cls(**kwargs)

    @classmethod
    def failed(cls, number: int, failure_class: FailureClass, message: str,
               layer: str | None = None, **extra: Any) -> "TrialResult":
        return cls(number=number, outcome=TrialOutcome.FAILED, failure_class=failure_class,
                   failure_message=message, failure_layer=layer, **extra)
