"""A trial costs only what it can still change: under objective memory a config that would rank
behind enough stable ones is not trained, and an emulated 16-bit dtype waits for the fast one
of the same widths (tuner.judging.worth_training, tuner.run.held)."""

import dataclasses
import math

from tests.support.scripted import Machine, ScriptedExecutor, scheduler_for, space_file
from tuner.apply.config import Float32Placement, LossScale, PrecisionConfig
from tuner.judging.worth_training import HoldKind, hold_for, needs_no_more_memory
from tuner.run.by_objective import winner_of
from tuner.run.confirmation_run import ConfirmBudget
from tuner.trial_types import TrialOutcome, TrialResult

F32 = PrecisionConfig()
BF16 = PrecisionConfig("bfloat16", weight_update="stochastic")
BF16_EPS = dataclasses.replace(BF16, epsilon=dataclasses.replace(BF16.epsilon, backend=1e-4))
BF16_KAHAN = PrecisionConfig("bfloat16", weight_update="compensated")
F16 = PrecisionConfig("float16", loss_scale=LossScale("dynamic"), weight_update="stochastic")
MIXED_BF16 = PrecisionConfig("mixed_bfloat16")
MIXED_F16 = PrecisionConfig("mixed_float16", loss_scale=LossScale("dynamic"))
SLOW_F16 = {"float16": 0.012}


def test_float16_and_bfloat16_take_the_same_bytes_and_pure_less_than_mixed():
    assert needs_no_more_memory(F16, BF16) and needs_no_more_memory(BF16, F16)
    assert needs_no_more_memory(BF16, MIXED_F16) and not needs_no_more_memory(MIXED_BF16, F16)
    placed = dataclasses.replace(BF16, float32=Float32Placement(groups=("softmax",)))
    assert not needs_no_more_memory(placed, F16) and needs_no_more_memory(F16, dataclasses.replace(
        F16, float32=placed.float32))
    assert not needs_no_more_memory(BF16_KAHAN, F16)   # its buffers


def test_a_config_is_held_only_behind_as_many_simpler_stable_ones_as_there_are_finalists():
    stable = [(0, F32), (3, BF16)]
    # One simpler stable config of no more memory: F16 could still be a finalist.
    assert hold_for(F16, stable, memory=True, emulated={}, finalists=2) is None
    hold = hold_for(F16, stable + [(5, BF16_EPS)], memory=True, emulated={}, finalists=2)
    assert hold.kind is HoldKind.DOMINATED and hold.by == (3, 5)
    # Never under speed or balanced (step time decides there), never the baseline.
    assert hold_for(F16, stable + [(5, BF16_EPS)], memory=False, emulated={},
                    finalists=2) is None
    assert hold_for(F32, stable, memory=True, emulated={}, finalists=1) is None
    # Compensated updates need more memory (their buffers): BF16_KAHAN cannot hold F16 back.
    assert hold_for(F16, [(0, F32), (4, BF16_KAHAN)], memory=True, emulated={},
                    finalists=1) is None


def test_an_emulated_dtype_waits_for_the_fast_one_of_its_widths():
    assert hold_for(F16, [(0, F32)], memory=True, emulated=SLOW_F16,
                    finalists=3).kind is HoldKind.DEFERRED
    # A stable mixed bfloat16 settles mixed_float16, not pure float16.
    stable = [(0, F32), (2, MIXED_BF16)]
    assert hold_for(MIXED_F16, stable, memory=True, emulated=SLOW_F16,
                    finalists=3).kind is HoldKind.EMULATED
    assert hold_for(F16, stable, memory=True, emulated=SLOW_F16,
                    finalists=3).kind is HoldKind.DEFERRED
    # Once the search is over and bfloat16 found nothing pure, float16 is trained.
    assert hold_for(F16, stable, memory=True, emulated=SLOW_F16, finalists=3, final=True) is None
    # On a device without fast bfloat16 (an older GPU) the roles swap.
    assert hold_for(BF16, [(0, F32), (7, F16)], memory=True, emulated={"bfloat16": 0.1},
                    finalists=3).kind is HoldKind.EMULATED
    # Both emulated: neither waits for the other.
    assert hold_for(F16, [(0, F32)], memory=True, emulated={**SLOW_F16, "bfloat16": 0.1},
                    finalists=3) is None


SPACE = """
policies: [float32, mixed_bfloat16, mixed_float16, bfloat16, float16]
loss_scale: {kinds: [dynamic, fixed], initial_scales: [32768], fixed_values: [128]}
weight_updates: [nearest, stochastic]
trials: 12
trial: {steps: 20, warmup_steps: 3}
"""
MEMORY = {"float32": 1000, "mixed_bfloat16": 900, "mixed_float16": 900, "bfloat16": 500,
          "float16": 500}
# float16 is emulated on this pretend CPU: a hundred times float32's step.
STEP_MS = {"float32": 20.0, "mixed_bfloat16": 15.0, "mixed_float16": 2000.0, "bfloat16": 18.0,
           "float16": 2400.0}


def _diverged(config, spec, exclusive):
    return TrialResult(number=spec.number, outcome=TrialOutcome.DIVERGED, losses=[2.0, math.nan],
                       step_times_ms=[5.0, 5.0], loss_scales=[None, None],
                       first_non_finite_step=1, warmup_steps=spec.warmup_steps)


class CountingProgress:
    """The progress display's calls: trials added beyond the budget, and phase lines."""

    def __init__(self) -> None:
        self.added, self.phases = 0, []

    def trial_started(self, number, description) -> None:
        pass

    def trial_finished(self, row, best, speedup) -> None:
        pass

    def phase(self, text) -> None:
        self.phases.append(text)

    def more(self, count) -> None:
        self.added += count


def _memory_tune(tmp_path, fail=lambda config, spec, exclusive: None):
    machine = Machine(step_ms=lambda c: STEP_MS[c.policy], seed=1, fail=fail,
                      memory=lambda c: MEMORY[c.policy])
    executor = ScriptedExecutor(machine)
    scheduler = scheduler_for(space_file(tmp_path, SPACE), executor, tmp_path, trials=12,
                              objective="memory", emulated=SLOW_F16)
    scheduler.plan = dataclasses.replace(scheduler.plan, confirm=ConfirmBudget(enabled=False))
    scheduler.progress = CountingProgress()
    scheduler.run()
    return scheduler, executor


def test_under_memory_no_float16_trial_runs_where_bfloat16_is_stable(tmp_path):
    scheduler, executor = _memory_tune(tmp_path)
    trained = [PrecisionConfig.from_dict(spec.config).policy for spec in executor.submitted]
    assert "bfloat16" in trained and "mixed_bfloat16" in trained
    assert "float16" not in trained and "mixed_float16" not in trained
    lines = scheduler.held.lines()
    emulated = [line for line in lines if line.startswith("float16 not tried: ")]
    assert len(emulated) == 1, lines
    assert "0.012x float32's speed on CPU (emulated)" in emulated[0]
    assert "--keep-slow-policies" in emulated[0]
    held = [p for p, h in scheduler.held.held if h.kind is HoldKind.EMULATED]
    assert held and all(p.config.compute_dtype == "float16" for p in held)
    assert all(p.config.describe() in emulated[0] for p in held[:3])
    # Optuna's study shows them as not trained, with the reason.
    told = [t for t in scheduler.proposer.study.trials if "not_trained" in t.user_attrs]
    assert len(told) >= len(held)
    assert told and all("emulates" in t.user_attrs["not_trained"] for t in told)
    outcome = winner_of(scheduler)
    assert outcome.winner.config.policy == "bfloat16"


def test_where_bfloat16_finds_nothing_pure_float16_is_tried_after_it(tmp_path):
    def pure_bfloat16_diverges(config, spec, exclusive):
        return _diverged(config, spec, exclusive) if config.policy == "bfloat16" else None

    scheduler, executor = _memory_tune(tmp_path, pure_bfloat16_diverges)
    policies = [PrecisionConfig.from_dict(spec.config).policy for spec in executor.submitted]
    assert "mixed_float16" not in policies          # mixed bfloat16 is stable
    first_float16 = policies.index("float16")
    assert "bfloat16" in policies[:first_float16]   # ... after bfloat16 had its turn
    lines = scheduler.held.lines()
    assert any(line.startswith("float16 tried after bfloat16 (#") for line in lines), lines
    # The progress bar's total grows by the trainings the search had deferred.
    progress = scheduler.progress
    trained_after = len(scheduler.held.trained_after)
    assert trained_after and progress.added == trained_after
    assert any(text.startswith("search over: ") for text in progress.phases)
    outcome = winner_of(scheduler)
    assert outcome.winner.config.policy == "float16"


def test_keep_slow_policies_trains_the_emulated_dtype_with_the_rest(tmp_path):
    machine = Machine(step_ms=lambda c: STEP_MS[c.policy], seed=1,
                      memory=lambda c: MEMORY[c.policy])
    executor = ScriptedExecutor(machine)
    scheduler = scheduler_for(space_file(tmp_path, SPACE), executor, tmp_path, trials=12,
                              objective="memory", emulated={})   # what --keep-slow-policies gives
    scheduler.run()
    policies = {PrecisionConfig.from_dict(spec.config).policy for spec in executor.submitted}
    assert "float16" in policies or "mixed_float16" in policies
    assert not [line for line in scheduler.held.lines() if "not tried" in line]


def test_a_trial_far_slower_than_float32_trains_for_its_time_bound_and_says_so(tmp_path):
    """Where bfloat16 finds nothing pure, float16 (a hundred times float32's step here) is
    trained after it: for the time bound, not its 20 steps, and judged on the steps it took
    against float32's first as many."""
    def pure_bfloat16_diverges(config, spec, exclusive):
        return _diverged(config, spec, exclusive) if config.policy == "bfloat16" else None

    scheduler, executor = _memory_tune(tmp_path, pure_bfloat16_diverges)
    plan = scheduler.plan
    assert plan.learned.time_bound_s == 2.0   # float32 trains 19 steps of 20 ms: the floor
    slow = [r for r in scheduler.rows if r.config.policy == "float16"]
    assert slow and all(r.judgement.judged_steps and r.judgement.judged_steps < plan.steps
                        for r in slow)
    for row in slow:
        assert len(row.result.losses) == row.judgement.judged_steps
        assert row.result.train_s >= plan.learned.time_bound_s
        assert row.judgement.stable                     # judged, not stopped
    fast = [r for r in scheduler.rows[1:] if r.config.policy == "mixed_bfloat16"]
    assert fast and all(r.judgement.judged_steps is None for r in fast)
    from tuner.run.held import stopped_lines
    lines = stopped_lines(scheduler.rows, plan.steps)
    assert len(lines) == 1 and lines[0].startswith("time-bounded: #")
    assert f"(not {plan.steps})" in lines[0]


def test_a_time_bounded_trial_is_compared_with_float32s_first_as_many_steps():
    """float32 learns over 40 steps; a bounded trial that took 10 is held to float32's first
    10 (not to where float32 ended), and one that learned nothing there is unstable, saying
    on how many steps."""
    from tuner.judging.verdict import judge

    rules = dict(floor=1.0, max_skipped_fraction=0.2, min_loss_decrease_ratio=0.9,
                 expected_steps=40)
    baseline = TrialResult(number=0, outcome=TrialOutcome.COMPLETED,
                           losses=[2.0 * 0.95**i for i in range(40)], step_times_ms=[1.0] * 40,
                           loss_scales=[None] * 40, warmup_steps=3,
                           validation={"loss": 0.1, "batch_losses": [0.1] * 8})

    def bounded(losses):
        return TrialResult(number=1, outcome=TrialOutcome.COMPLETED, losses=losses,
                           step_times_ms=[100.0] * len(losses), loss_scales=[None] * len(losses),
                           warmup_steps=3, time_bounded_s=2.0,
                           validation={"loss": 1.5, "batch_losses": [1.5] * 8})

    kept_pace = judge(bounded(baseline.losses[:10]), baseline, **rules)
    assert kept_pace.stable and kept_pace.judged_steps == 10   # its validation not compared
    stalled = judge(bounded([2.0] * 10), baseline, **rules)
    assert not stalled.stable and stalled.judged_steps == 10
    assert "judged on its first 10 steps against float32's first 10" in stalled.reason
    # Judged on the full count, the same losses fall short of float32's 40 steps.
    unbounded = dataclasses.replace(bounded(baseline.losses[:10]), time_bounded_s=None,
                                    validation=baseline.validation)
    assert "of float32's loss decrease" in judge(unbounded, baseline, **rules).reason
