"""What "best" means beyond speed: the least memory, or a balance read off the Pareto front."""

import dataclasses

import pytest

from tests.support.scripted import Machine, ScriptedExecutor, scheduler_for, space_file
from tuner.apply.config import Float32Placement, PrecisionConfig
from tuner.judging.objective import Point, pareto_front, pick
from tuner.judging.verdict import Verdict
from tuner.judging.worth_training import needs_no_more_memory
from tuner.run.by_objective import winner_of
from tuner.run.confirmation_run import ConfirmBudget

F32 = PrecisionConfig()
MIXED = PrecisionConfig("mixed_bfloat16")
MIXED_PLACED = PrecisionConfig("mixed_bfloat16", float32=Float32Placement(("softmax",)))
PURE = PrecisionConfig("bfloat16", weight_update="stochastic")
PURE_KAHAN = PrecisionConfig("bfloat16", weight_update="compensated")


def test_the_front_keeps_only_configs_nothing_beats_on_both():
    points = [Point(0, F32, 10.0, 1000), Point(1, MIXED, 7.0, 800),
              Point(2, MIXED_PLACED, 8.0, 850),  # beaten by #1 on both
              Point(3, PURE, 9.0, 500), Point(4, PURE_KAHAN, 9.5, 600)]  # #4 beaten by #3
    assert [p.number for p in pareto_front(points)] == [3, 1]


def test_memory_picks_the_smallest_and_a_shared_smallest_goes_to_the_simpler():
    points = [Point(0, F32, 10.0, 1000), Point(3, PURE_KAHAN, 8.0, 500), Point(4, PURE, 9.0, 500)]
    chosen, why = pick(points, "memory")
    assert chosen.number == 4  # stochastic is simpler than compensated; equal memory
    assert "0.0005 MB" in why and "shared by 2 configs" in why


def test_balanced_picks_the_fastest_within_the_slack_of_the_smallest_memory():
    points = [Point(0, F32, 10.0, 1000), Point(1, MIXED, 6.0, 800), Point(3, PURE, 9.0, 500),
              Point(5, PURE_KAHAN, 5.0, 540)]
    chosen, why = pick(points, "balanced", memory_slack=0.10)
    assert chosen.number == 5 and "within 10% of its smallest memory" in why
    chosen, _ = pick(points, "balanced", memory_slack=0.05)
    assert chosen.number == 3  # 540 is 8% above 500: outside a 5% slack


def test_balanced_treats_a_speed_difference_inside_the_drift_as_a_tie():
    points = [Point(3, PURE, 9.5, 500), Point(5, PURE_KAHAN, 9.0, 505)]
    chosen, why = pick(points, "balanced", memory_slack=0.10)
    assert chosen.number == 3 and "simpler #3 wins" in why


def test_nothing_to_pick_from_is_an_error():
    with pytest.raises(ValueError):
        pick([], "memory")


# -- the objective decides the whole run (scripted executor: its early stop is the worker's) ------

SPACE = """
policies: [float32, mixed_bfloat16, bfloat16]
weight_updates: [nearest, compensated]
trials: 4
trial: {steps: 20, warmup_steps: 3}
"""
# On this pretend machine 16-bit is slow (as float16 is on a CPU) but needs less memory.
SLOW_16 = {"float32": 20.0, "mixed_bfloat16": 45.0, "bfloat16": 60.0}
MEMORY = {"float32": 1000, "mixed_bfloat16": 900, "bfloat16": 500}


def _tune(tmp_path, objective, val_loss=None, confirm=ConfirmBudget(steps=200)):
    tmp_path.mkdir(parents=True, exist_ok=True)
    machine = Machine(step_ms=lambda c: SLOW_16[c.policy], seed=3,
                      memory=lambda c: MEMORY[c.policy] + (50 if c.weight_update ==
                                                           "compensated" else 0),
                      **({"val_loss": val_loss} if val_loss else {}))
    scheduler = scheduler_for(space_file(tmp_path, SPACE), ScriptedExecutor(machine), tmp_path,
                              trials=4, objective=objective)
    scheduler.plan = dataclasses.replace(scheduler.plan, confirm=confirm)
    scheduler.run()
    return scheduler, winner_of(scheduler)


def test_under_memory_no_trial_is_stopped_for_speed_and_the_smallest_is_exported(tmp_path):
    scheduler, outcome = _tune(tmp_path / "memory", "memory")
    assert [r.judgement.verdict for r in scheduler.rows] == [Verdict.STABLE] * 4
    assert outcome.winner.config.policy == "bfloat16"
    assert outcome.winner.config.weight_update == "nearest"
    assert outcome.confirmations[0].passed
    # The same search under speed stops the slow ones: the stop the memory run left out.
    speed, _ = _tune(tmp_path / "speed", "speed")
    assert any(r.judgement.verdict is Verdict.STOPPED_SLOW for r in speed.rows)


def test_a_rejected_memory_pick_falls_to_the_next_by_memory_not_to_float32(tmp_path):
    """pure bfloat16 plateaus later in training: the confirmation rejects it, and the next by
    memory (bfloat16 with compensated updates plateaus too; then mixed_bfloat16) is confirmed."""
    def loss(config, steps):
        base = 0.1 + 2.0 / (1.0 + steps / 20.0)
        return max(base, 0.6) if config.policy == "bfloat16" else base

    scheduler, outcome = _tune(tmp_path, "memory", val_loss=loss)
    tried = [scheduler.rows[c.trial].config for c in outcome.confirmations]
    assert [c.policy for c in tried] == ["bfloat16", "bfloat16", "mixed_bfloat16"]
    assert [c.passed for c in outcome.confirmations] == [False, False, True]
    assert outcome.winner.config.policy == "mixed_bfloat16"
    assert "failed its confirmation" in outcome.decision.explanation
    assert "the next by objective memory" in outcome.decision.explanation
    assert {r.number for r in scheduler.rows if r.remeasured_rounds} >= {
        c.trial for c in outcome.confirmations}   # each confirmed finalist was re-measured


def test_balanced_stops_a_trial_only_against_a_config_that_needs_no_more_memory(tmp_path):
    """Under balanced a slow pure-bfloat16 trial may still hold the smallest memory: only a
    faster config that needs no more memory (which dominates it) may stop it."""
    scheduler, _ = _tune(tmp_path, "balanced", confirm=ConfirmBudget(enabled=False))
    plain = PrecisionConfig(policy="bfloat16")
    compensated = PrecisionConfig(policy="bfloat16", weight_update="compensated")
    assert needs_no_more_memory(plain, compensated) and not needs_no_more_memory(compensated,
                                                                                 plain)
    assert not needs_no_more_memory(PrecisionConfig(), plain)            # float32
    assert not needs_no_more_memory(PrecisionConfig(policy="mixed_bfloat16"), plain)
    assert not needs_no_more_memory(PrecisionConfig(policy="bfloat16", float32=Float32Placement(
        groups=("softmax",))), plain)
    float32_ms = scheduler.baseline.judgement.median_step_ms
    stable_plain = [r.judgement.median_step_ms for r in scheduler.rows if r.judgement.stable
                    and needs_no_more_memory(r.config, plain)]
    assert stable_plain                   # a plain bfloat16 trial ran: it alone sets the limit
    assert scheduler.stop_limit_ms(plain) == pytest.approx(1.5 * min(stable_plain))
    assert scheduler.stop_limit_ms(plain) > 3 * float32_ms       # never float32's 1.5x
    # float16 takes bfloat16's bytes: the same stable configs dominate it.
    assert scheduler.stop_limit_ms(PrecisionConfig(policy="float16")) == pytest.approx(
        scheduler.stop_limit_ms(plain))
    speed = dataclasses.replace(scheduler.plan, objective="speed")
    scheduler.plan = speed
    assert scheduler.stop_limit_ms(plain) == pytest.approx(1.5 * float32_ms)


def test_a_config_whose_memory_count_failed_is_named_not_silently_dropped(tmp_path):
    machine = Machine(step_ms=lambda c: SLOW_16[c.policy], seed=3,
                      memory=lambda c: None if c.policy == "bfloat16" else MEMORY[c.policy])
    scheduler = scheduler_for(space_file(tmp_path, SPACE), ScriptedExecutor(machine), tmp_path,
                              trials=4, objective="memory")
    scheduler.plan = dataclasses.replace(scheduler.plan, confirm=ConfirmBudget(enabled=False))
    scheduler.run()
    outcome = winner_of(scheduler)
    assert outcome.winner.config.policy == "mixed_bfloat16"
    # Both bfloat16 configs ran stable, so both are candidates whose count failed.
    uncounted = [r for r in scheduler.rows if r.config.policy == "bfloat16" and r.judgement.stable]
    assert {r.config.weight_update for r in uncounted} == {"nearest", "compensated"}
    assert all(
        f"left #{r.number} ({r.config.describe()}) out: its training memory could not be "
        "counted (TypeError: an eager call of the model raised)" in outcome.objective_lines
        for r in uncounted)
