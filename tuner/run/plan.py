"""The run plan: every setting of a tuning job, resolved once, with concrete values.

Resolved from the job's options (``TuneOptions``), the search space and — when a run
directory is resumed — the settings recorded in its ``run.json`` (a resumed run keeps its
settings; an option that disagrees is refused). Frozen: nothing downstream fills in a default
or rewrites an option.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tuner.apply.config import compute_dtype_of
from tuner.errors import UsageError
from tuner.judging.ceiling_limit import dtype_ceilings, no_fast_16bit, ruled_out
from tuner.judging.decision import DEFAULT_MIN_GAIN
from tuner.judging.noise import RUN_DRIFT_SD
from tuner.judging.objective import DEFAULT_MEMORY_SLACK, Objective
from tuner.judging.sizing import BATCH_POOL, DEFAULT_CAP_S, Sizing
from tuner.judging.underflow import gradient_histograms
from tuner.records.timing import CANNOT_WIN_BELOW
from tuner.run.confirmation_run import DEFAULT_SECONDS as DEFAULT_CONFIRM_SECONDS
from tuner.run.confirmation_run import ConfirmBudget
from tuner.run.options import (
    DEFAULT_FINALISTS,
    DEFAULT_TIME_LIMIT,
    TuneOptions,
    check_combinations,
    check_resume,
    space_ref,
)
from tuner.search.space import MIN_TIMED_STEPS, SearchSpace
from tuner.search.space_files import load_space

# A trial whose training runs past this many times the float32 baseline's (an emulated dtype
# runs 10-300x slower) stops there and is judged on the steps it took; never under
# MIN_BOUND_S (a tiny model's baseline trains in a fraction of a second, inside one stall of a
# shared machine).
SLOW_TRIAL_BOUND = 4.0
MIN_BOUND_S = 2.0


@dataclass(frozen=True)
class Remeasurement:
    """How the finalists are re-timed against float32 before a winner is named."""

    min_rounds: int = 4                 # 3 stopped early on lucky rounds (see tuner.judging.noise)
    max_rounds: int = 16
    # Each run trains this share of a trial's steps (at least ``min_run_steps`` timed ones).
    # Quarter-length runs cost a quarter and were far less than twice as noisy as whole ones:
    # the spread of a round's log speedup grew 1.3-1.7x (benchmarks/run_length.py: audio_cnn,
    # digits_mlp, house_prices, 2-core CPU), as much of it is the level moving between runs,
    # not the steps inside one. For the time spent, the rounds' interval is then narrower and
    # a stop is reached sooner.
    run_share: float = 0.25
    min_run_steps: int = 20
    target_half_width: float = 0.05     # stop adding rounds once the leader is known to +-5%
    time_cap_s: float = 240.0           # ... or once this long has been spent (after min_rounds)
    settle: bool = True                 # ... or once more rounds cannot change the pick


@dataclass(frozen=True)
class Learned:
    """What a run learns of the task's model and this device, apart from what the user asked
    for (``RunPlan``'s own fields): from the task check (the layers each float32 group
    selects), the diagnostics (inputs, gradients, the loss scale they recommend), the device's
    ceiling (the policies it rules out) and the float32 baseline (the trials' steps and time
    bound). Each arrives through one of ``RunPlan``'s fitting methods, and ``run.json`` keeps
    what a resumed run must not learn again."""

    # Which layers each float32 group and pattern selects in the model (from the task check);
    # None until the plan is fitted to the model.
    matches: dict[str, Any] | None = None
    # Layers that take integer-valued floats (from diagnostics): every trial checks them.
    integer_inputs: tuple[dict[str, Any], ...] = ()
    # Layers that take continuous features a 16-bit cast erases (from diagnostics): likewise.
    continuous_inputs: tuple[dict[str, Any], ...] = ()
    # The diagnostics' smallest 1% of weight gradients: whether float16 needs a loss scale.
    gradient_p01: float | None = None
    # Each layer's weight-gradient exponent histogram (tuner.judging.underflow), by layer.
    gradient_histograms: Mapping[str, Mapping[str, int]] | None = None
    recommended_scale: float | None = None   # the diagnostics' initial loss scale
    gradient_abs_max: float | None = None    # ... from this largest weight gradient
    growth_note: str = ""                     # why growth intervals were searched as one
    # Policies left out because the device's ceiling says they cannot win; None until decided
    # (a resumed run keeps what its run decided).
    skipped_policies: tuple[str, ...] | None = None
    # The 16-bit dtypes the device's ceiling says it emulates (dtype -> the small step's
    # speed against float32's) and that device: under memory their configs wait for the fast
    # dtype's (tuner.judging.worth_training). Empty with --keep-slow-policies.
    emulated: Mapping[str, float] = dataclasses.field(default_factory=dict)
    ceiling_device: str = ""
    # Why float32 is the answer without 16-bit trials: every 16-bit policy of the space was
    # left out by the device's ceiling (tuner.judging.ceiling_limit.no_fast_16bit); "" when
    # some remain. The search then trains the float32 baseline only.
    float32_by_ceiling: str = ""
    # Once the baseline has trained: how long a later trial (and its re-measurement) trains
    # at most before it is judged on the steps it took (``time_bounded``).
    time_bound_s: float | None = None
    # Steps not fixed by --steps: the float32 baseline trial is sized by this rule and every
    # later trial trains its count (``sized``); None once sized, or when --steps fixed it.
    sizing: Sizing | None = None
    sized_by: str = ""                  # why the baseline stopped where it did
    batch_pool: int | None = None       # distinct batches every run cycles through


@dataclass(frozen=True)
class RunPlan:
    task_path: Path
    run_dir: Path
    space: SearchSpace
    space_ref: str                      # built-in name or the YAML file's absolute path
    trials: int                         # the budget (the grid's size when exhaustive)
    steps: int
    seed: int
    tolerance: float                    # share of float32's loss decrease a trial must reach
    exhaustive: bool
    tracking_uri: str | None            # None: SQLite in the run directory
    resume: bool
    finalists: int = DEFAULT_FINALISTS
    trial_time_limit_s: float = DEFAULT_TIME_LIMIT
    slow_factor: float = 1.5            # early-stop limit: this much slower than the best
    min_gain: float = DEFAULT_MIN_GAIN  # a 16-bit config must be faster than this, beyond noise
    # The between-run sd of a log speedup each speedup over float32 is widened by
    # (tuner.judging.noise): the level moves between runs by more than one run's rounds show.
    run_drift: float = RUN_DRIFT_SD
    remeasurement: Remeasurement = Remeasurement()
    keep_slow_policies: bool = False    # try policies the device's ceiling says cannot win
    strict_float32: bool = False        # TF32 off in every trial (tuner.worker.device.tf32)
    worker_memory: int | None = None    # bytes a worker may count on (tuner.run.kept_models)
    objective: Objective = Objective.SPEED
    memory_slack: float = DEFAULT_MEMORY_SLACK  # balanced: how much above the smallest memory
    # What the run learned of the model and this device (``Learned``), fitted as it learned it.
    learned: Learned = dataclasses.field(default_factory=Learned)
    confirm: ConfirmBudget = ConfirmBudget()  # the pick's longer training before export

    def __post_init__(self) -> None:  # "memory" from run.json or a caller: the Objective
        object.__setattr__(self, "objective", Objective(self.objective))

    @property
    def warmup_steps(self) -> int:
        return self.space.budget.warmup_steps

    @property
    def enumerates_space(self) -> bool:
        """True when every config of the space will run (exhaustive, or a budget that covers
        it): then the space is enumerated once instead of sampled with repeats."""
        return self.exhaustive or self.trials >= self.space.size()

    def settings(self) -> dict[str, Any]:
        """What run.json records (and a resumed run is held to)."""
        return {"task": str(self.task_path), "space": self.space_ref, "trials": self.trials,
                "steps": self.steps, "seed": self.seed, "tolerance": self.tolerance,
                "exhaustive": self.exhaustive, "min_gain": self.min_gain,
                "run_drift": self.run_drift, "strict_float32": self.strict_float32,
                "skipped_policies": list(self.learned.skipped_policies or ()),
                "objective": self.objective.value, "memory_slack": self.memory_slack,
                "sizing": self.learned.sizing.to_dict() if self.learned.sizing else None,
                "sized_by": self.learned.sized_by, "batch_pool": self.learned.batch_pool,
                "confirm": dataclasses.asdict(self.confirm)}

    def learn(self, **facts: Any) -> "RunPlan":
        """The plan with ``facts`` learned (``Learned``'s fields by name)."""
        return dataclasses.replace(self, learned=dataclasses.replace(self.learned, **facts))

    def sized(self, steps: int, why: str) -> "RunPlan":
        """The plan once the baseline is sized: every later run trains ``steps`` steps."""
        return dataclasses.replace(self, steps=steps).learn(sizing=None, sized_by=why)

    def time_bounded(self, baseline_train_s: float) -> "RunPlan":
        """The plan once the baseline has trained: a trial far slower than it trains for at
        most ``SLOW_TRIAL_BOUND`` times its training time (never under ``MIN_BOUND_S``)."""
        return self.learn(time_bound_s=max(SLOW_TRIAL_BOUND * baseline_train_s, MIN_BOUND_S))

    def describe_steps(self) -> str:
        sizing = self.learned.sizing
        if sizing is None:
            return f"{self.steps} steps"
        return (f"steps sized by the float32 baseline: at least {sizing.floor}, at most "
                f"{sizing.cap_s:g} s of training")

    def fitted_to(self, matches: dict[str, Any],
                  optimizer: dict[str, Any] | None = None) -> tuple["RunPlan", list[str]]:
        """The plan over the space fitted to the model, its optimizer and the trials' length:
        float32 groups that select no layer, optimizer epsilons the optimizer cannot take and
        growth intervals no trial reaches dropped (one line each, returned); a pattern that
        selects none is refused (SearchSpaceError, exit 2)."""
        space, notes = self.space.fitted(matches, optimizer)
        # Every trial trains at least the space's steps where the baseline sizes the count.
        sized = self.learned.sizing is not None or bool(self.learned.sized_by)
        space, growth = space.fitted_to_steps(self.space.budget.steps if sized else self.steps)
        notes += growth
        trials = space.size() if self.exhaustive else self.trials
        return dataclasses.replace(self, space=space, trials=trials).learn(
            matches=matches, growth_note=growth[0] if growth else ""), notes

    def within_ceiling(self, ceiling: dict[str, Any] | None) -> tuple["RunPlan", list[str]]:
        """The plan without the policies whose compute dtype the device's ceiling says cannot
        beat float32 (``tuner.worker.device.ceiling``), one line each; a resumed run leaves out what
        it left out before. Only under the speed objective; ``keep_slow_policies`` keeps them
        all. The slow dtypes are also the plan's ``emulated`` ones, whose configs under memory
        wait for the fast dtype's (tuner.judging.worth_training)."""
        slow = {} if self.keep_slow_policies or not ceiling else {
            dtype: speed for dtype, speed in ceiling["speed"].items()
            if dtype != "float32" and speed < CANNOT_WIN_BELOW}
        # At the model's own scale (tuner.judging.ceiling_limit): the speed objective only.
        at_scale = {} if self.keep_slow_policies or not self.objective.skips_slow_policies \
            else ruled_out(ceiling, self.min_gain)
        if self.learned.skipped_policies is not None:
            skipped, notes = self.learned.skipped_policies, []
        elif not (slow or at_scale) or not self.objective.skips_slow_policies:
            # Under memory or balanced a slow 16-bit policy may still be the pick by its memory.
            skipped, notes = (), []
        else:
            skipped = tuple(p for p in self.space.policies if p != "float32"
                            and (compute_dtype_of(p) in slow or compute_dtype_of(p) in at_scale))
            notes = [f"skipping {', '.join(p for p in skipped if compute_dtype_of(p) == dtype)}: "
                     + (f"{dtype} runs a dense layer's training step at {slow[dtype]:.2g}x "
                        f"float32's speed on {ceiling['device']}" if dtype in slow else
                        f"{dtype} runs {at_scale[dtype].describe()} on {ceiling['device']}")
                     + ", so it cannot win here (pass --keep-slow-policies to try it anyway)"
                     for dtype in dict.fromkeys([*slow, *at_scale])
                     if any(compute_dtype_of(p) == dtype for p in skipped)]
        space = dataclasses.replace(self.space, policies=tuple(
            p for p in self.space.policies if p not in skipped))
        trials = space.size() if self.exhaustive else self.trials
        # No 16-bit policy left: float32 is the answer once the baseline has trained.
        answer = ""
        if skipped and all(p == "float32" for p in space.policies):
            answer = no_fast_16bit(ceiling or {}, {
                **{d: c for d, c in dtype_ceilings(ceiling).items()
                   if any(compute_dtype_of(p) == d for p in skipped)}})
            trials = 1
        return dataclasses.replace(self, space=space, trials=trials).learn(
            skipped_policies=tuple(skipped), emulated=slow,
            ceiling_device=(ceiling or {}).get("device", ""), float32_by_ceiling=answer), notes

    def with_diagnostics(self, diagnostics: dict[str, Any]) -> "RunPlan":
        """The plan over the space informed by diagnostics (riskiest layers, loss scale)."""
        space = self.space.with_diagnostics(diagnostics["candidates"],
                                            diagnostics["loss_scale"]["initial_scale"],
                                            diagnostics.get("output_heads", ()))
        trials = space.size() if self.exhaustive else self.trials
        return dataclasses.replace(self, space=space, trials=trials).learn(
            integer_inputs=tuple(diagnostics.get("integer_inputs", ())),
            continuous_inputs=tuple(diagnostics.get("continuous_inputs", ())),
            gradient_p01=diagnostics.get("gradient_p01_nonzero"),
            gradient_histograms=gradient_histograms(diagnostics),
            recommended_scale=diagnostics["loss_scale"]["initial_scale"],
            gradient_abs_max=diagnostics.get("gradient_abs_max"))


def check_steps(steps: int, warmup_steps: int, what: str) -> None:
    if steps < warmup_steps + MIN_TIMED_STEPS:
        raise UsageError(f"{what} must exceed the space's warmup_steps ({warmup_steps}) by at "
                         f"least {MIN_TIMED_STEPS}, so that step times can be measured after "
                         f"warm-up. Received: {what} {steps}")


def resolve(options: TuneOptions, previous: dict[str, Any] | None) -> RunPlan:
    """The plan for new run (``previous`` is None) or for resuming the run ``previous``
    describes (its run.json). Raises UsageError when the options conflict."""
    check_combinations(options)
    if previous is not None:
        check_resume(previous, options)
        ref, recorded = previous["space"], previous
    else:
        ref, recorded = space_ref(options.space or "quick"), {}
    space = load_space(ref)
    exhaustive = recorded.get("exhaustive", options.exhaustive)
    steps = recorded.get("steps") or options.steps or space.budget.steps
    check_steps(steps, space.budget.warmup_steps, "--steps")
    if previous is not None:
        sizing = Sizing.from_dict(recorded["sizing"]) if recorded.get("sizing") else None
        pool = recorded.get("batch_pool") or steps
    elif options.steps is None:
        sizing = Sizing(floor=steps, min_steps=space.budget.warmup_steps + MIN_TIMED_STEPS,
                        cap_s=options.trial_seconds or DEFAULT_CAP_S,
                        tolerance=options.tolerance or space.budget.min_loss_decrease_ratio)
        pool = max(steps, BATCH_POOL)
    else:
        sizing, pool = None, steps
    trials = space.size() if exhaustive else (recorded.get("trials") or options.trials
                                              or space.trials)
    return RunPlan(
        task_path=options.task.resolve(), run_dir=options.run_dir, space=space, space_ref=ref,
        trials=trials, steps=steps, seed=recorded.get("seed", options.seed or 0),
        tolerance=recorded.get("tolerance") or options.tolerance
        or space.budget.min_loss_decrease_ratio,
        exhaustive=exhaustive, tracking_uri=options.tracking_uri, resume=previous is not None,
        finalists=options.finalists, trial_time_limit_s=float(options.time_limit),
        min_gain=recorded.get("min_gain", options.min_gain),
        run_drift=recorded.get("run_drift", RUN_DRIFT_SD if options.run_drift is None
                               else options.run_drift),
        keep_slow_policies=options.keep_slow_policies,
        strict_float32=recorded.get("strict_float32", options.strict_float32),
        worker_memory=None if options.worker_memory is None
        else int(options.worker_memory * 2**30),
        objective=recorded.get("objective") or options.objective or Objective.SPEED,
        memory_slack=recorded.get("memory_slack") or options.memory_slack
        or DEFAULT_MEMORY_SLACK,
        learned=Learned(
            skipped_policies=tuple(recorded.get("skipped_policies", ())) if previous else None,
            sizing=sizing, sized_by=recorded.get("sized_by", ""), batch_pool=pool),
        confirm=_confirm_budget(options, recorded.get("confirm")))


def _confirm_budget(options: TuneOptions, recorded: dict[str, Any] | None) -> ConfirmBudget:
    """The confirmation's budget: a resumed run keeps its own."""
    if recorded:
        return ConfirmBudget(**recorded)
    return ConfirmBudget(enabled=not options.no_confirm, steps=options.confirm_steps,
                         seconds=options.confirm_seconds or DEFAULT_CONFIRM_SECONDS)
