"""The search's decisions, through a scripted executor: winner, ties, early stop, exhaustive
runs with repairs, a crash during the re-measurement, and Optuna's record of repeats."""

import math

import pytest

from tests.support.scripted import Machine, ScriptedExecutor, scheduler_for, space_file
from tuner.apply.config import PrecisionConfig
from tuner.run.by_objective import winner_of
from tuner.run.remeasure import remeasure
from tuner.trial_types import FailureClass, TrialResult

PLACEBO = """
policies: [float32, mixed_bfloat16]
epsilon:
  backend: [null, 1.0e-4, 1.0e-3]
  optimizer: [null, 1.0e-4, 1.0e-3]
trials: 9
trial: {steps: 20, warmup_steps: 3}
"""

MIXED = """
policies: [float32, mixed_bfloat16]
float32: {groups: [softmax]}
trials: 3
trial: {steps: 20, warmup_steps: 3}
"""

WITH_FLOAT16 = """
policies: [float32, mixed_float16, mixed_bfloat16]
loss_scale: {kinds: [none, dynamic]}
float32: {groups: [softmax]}
trials: 7
trial: {steps: 20, warmup_steps: 3}
"""


def tune(space, machine, tmp_path, **options):
    executor = ScriptedExecutor(machine)
    scheduler = scheduler_for(space, executor, tmp_path, **options)
    exhausted = scheduler.run()
    return scheduler, winner_of(scheduler), executor, exhausted


@pytest.mark.parametrize("seed", range(5))
def test_placebo_space_exports_plain_float32(tmp_path, seed):
    """Neither bfloat16 nor its epsilons change a step's cost here: no such config may be
    exported as a speedup."""
    machine = Machine(step_ms=lambda config: 20.0, drift=0.06, seed=seed)
    scheduler, outcome, _, _ = tune(space_file(tmp_path, PLACEBO), machine, tmp_path,
                                    trials=9, seed=seed)
    assert outcome.winner is scheduler.baseline
    assert outcome.winner.config == PrecisionConfig()
    assert "no config beats float32 beyond noise" in outcome.decision.explanation \
        or "slower than float32" in outcome.decision.explanation
    assert outcome.decision.estimate.ratio == 1.0


def test_a_tie_goes_to_float32(tmp_path):
    machine = Machine(step_ms=lambda c: 20.0 if c.policy == "float32" else 20.2, seed=3)
    _, outcome, _, _ = tune(space_file(tmp_path, MIXED), machine, tmp_path, trials=3)
    assert outcome.winner.config.policy == "float32"


def test_a_real_gain_wins_and_its_interval_holds_the_true_speedup(tmp_path):
    true = {"float32": 30.0, "mixed_bfloat16": 30.0 / 1.45}
    covered = 0
    for seed in range(20):
        machine = Machine(step_ms=lambda c: true[c.policy], seed=seed)
        _, outcome, _, _ = tune(space_file(tmp_path, MIXED), machine, tmp_path, trials=3,
                                seed=seed)
        estimate = outcome.decision.estimate
        assert outcome.winner.config.policy == "mixed_bfloat16" and estimate.low > 1.03
        # Both bf16 configs cost the same: the simpler one (no float32 placement) wins.
        assert outcome.winner.config.float32.groups == ()
        covered += estimate.low <= 1.45 <= estimate.high
    assert covered >= 17  # a 95% interval: about 19 of 20


def test_a_first_run_penalty_on_a_fresh_worker_cannot_make_a_slower_config_win(tmp_path):
    """The 'wrong answer': float32 re-measured first on a fresh worker looked 46% slow, and a
    config that an A/B times at 0.93x was exported as 1.34x."""
    true = {"float32": 22.6, "mixed_bfloat16": 22.6 / 0.93}
    machine = Machine(step_ms=lambda c: true[c.policy], first_run_penalty=1.46, seed=2)
    scheduler, outcome, executor, _ = tune(space_file(tmp_path, MIXED), machine, tmp_path,
                                           trials=3)
    assert outcome.winner.config.policy == "float32"
    bf16 = [r for r in scheduler.rows if r.config.policy == "mixed_bfloat16" and r.estimate]
    assert bf16 and all(r.estimate.low < 1.0 for r in bf16)
    assert executor.remeasured[0] == 0  # the discarded warm-up run is float32's


def test_rounds_stop_at_the_target_or_the_cap_and_say_which(tmp_path):
    from tuner.run.plan import Remeasurement

    machine = Machine(step_ms=lambda c: 20.0 if c.policy == "float32" else 10.0, drift=0.01,
                      jitter=0.01)
    _, calm, _, _ = tune(space_file(tmp_path, MIXED), machine, tmp_path, trials=3)
    assert "in 4 rounds" in calm.notes[0]
    noisy = Machine(step_ms=lambda c: 20.0, drift=0.3, seed=4)
    _, capped, _, _ = tune(space_file(tmp_path, MIXED), noisy, tmp_path, trials=3,
                           remeasurement=Remeasurement(max_rounds=4, time_cap_s=1e9))
    assert "4 rounds, stopped by the 4-round cap" in capped.notes[0]


def test_a_crash_during_the_remeasurement_loses_that_finalist_only(tmp_path):
    crashed = []

    def crash_once(config, spec, exclusive):
        if exclusive and config.float32.groups and not crashed:
            crashed.append(spec.number)
            return TrialResult.failed(spec.number, FailureClass.WORKER_CRASHED,
                                      "worker process crashed (exit code -9); replaced",
                                      warmup_steps=spec.warmup_steps)
        return None

    true = {"float32": 30.0, "mixed_bfloat16": 15.0}
    machine = Machine(step_ms=lambda c: true[c.policy], fail=crash_once)
    _, outcome, _, _ = tune(space_file(tmp_path, MIXED), machine, tmp_path, trials=3)
    assert crashed
    assert any(f"lost #{crashed[0]}" in note and "worker process crashed" in note
               for note in outcome.notes)
    assert outcome.winner.config.policy == "mixed_bfloat16"
    assert outcome.winner.number != crashed[0]


def test_exhaustive_runs_every_grid_config_whatever_repairs_happen(tmp_path):
    space = space_file(tmp_path, WITH_FLOAT16)

    def mismatch(config, spec, exclusive):
        if config.policy == "mixed_float16" and "dense_1" not in config.float32.layers:
            return TrialResult.failed(spec.number, FailureClass.DTYPE_MISMATCH,
                                      "dtype mismatch in layer dense_1", "dense_1",
                                      warmup_steps=spec.warmup_steps)
        return None

    machine = Machine(step_ms=lambda c: 20.0, fail=mismatch)
    scheduler, _, _, _ = tune(space, machine, tmp_path, trials=0, exhaustive=True)
    from tuner.search.proposer import config_key

    ran = {config_key(r.config) for r in scheduler.rows}
    grid = {config_key(space.config_from_params(p)) for p in space.grid_params()}
    assert grid <= ran
    repairs = [r for r in scheduler.rows if r.repair]
    assert repairs and all("dense_1" in r.config.float32.layers for r in repairs)
    assert len(scheduler.rows) == len(grid) + len(repairs)


def test_optuna_counts_each_training_once(tmp_path):
    """A sampler that repeats a config gets its repeat told as PRUNED with repeat_of."""
    import optuna

    space = space_file(tmp_path, WITH_FLOAT16)
    machine = Machine(step_ms=lambda c: 20.0 if c.policy == "float32" else 12.0)
    scheduler, _, _, _ = tune(space, machine, tmp_path, trials=6)
    study = scheduler.proposer.study
    finished = [t for t in study.trials if t.state.is_finished()]
    trainings = [t for t in finished if "repeat_of" not in t.user_attrs]
    assert sorted(t.user_attrs["trial"] for t in trainings) == \
        sorted(r.number for r in scheduler.rows if not r.repair)
    repeats = [t for t in finished if "repeat_of" in t.user_attrs]
    assert all(t.state is optuna.trial.TrialState.PRUNED for t in repeats)
    numbers = {r.number for r in scheduler.rows}
    assert all(t.user_attrs["repeat_of"] in numbers for t in repeats)


def test_a_budget_that_covers_the_space_enumerates_it_once(tmp_path):
    space = space_file(tmp_path, MIXED)
    machine = Machine(step_ms=lambda c: 20.0)
    scheduler, _, _, exhausted = tune(space, machine, tmp_path, trials=10)
    assert len(scheduler.rows) == space.size() == 3
    assert len(scheduler.proposer.study.trials) == 3 and exhausted


def test_early_stop_limit_comes_from_exclusive_timings(tmp_path):
    machine = Machine(step_ms=lambda c: 20.0 if c.policy == "float32" else 10.0, drift=0.0,
                      jitter=0.0)
    scheduler, _, _, _ = tune(space_file(tmp_path, MIXED), machine, tmp_path, trials=3)
    for row in scheduler.rows:
        row.result.exclusive_timing = row.number == 0
    # Only float32 (20 ms) was timed alone: the limit comes from it, not the shared 10 ms.
    assert scheduler.stop_limit_ms() == pytest.approx(1.5 * 20.0)
    for row in scheduler.rows:
        row.result.exclusive_timing = False
    assert scheduler.stop_limit_ms() == pytest.approx(1.5 * 1.5 * 10.0)  # widened


def test_no_stable_16bit_config_gives_float32_without_remeasuring(tmp_path):
    def diverge(config, spec, exclusive):
        if config.policy != "float32":
            return TrialResult.failed(spec.number, FailureClass.OTHER, "boom",
                                      warmup_steps=spec.warmup_steps)
        return None

    machine = Machine(step_ms=lambda c: 20.0, fail=diverge)
    _, outcome, executor, _ = tune(space_file(tmp_path, MIXED), machine, tmp_path, trials=3)
    assert outcome.winner.number == 0 and not executor.remeasured
    assert math.isclose(outcome.decision.estimate.ratio, 1.0)


# -- objectives beyond speed ----------------------------------------------------------------------
PURE = """
policies: [float32, mixed_bfloat16, bfloat16]
weight_updates: [nearest, stochastic]
trials: 4
trial: {steps: 20, warmup_steps: 3}
"""


def _memory_machine():
    return Machine(step_ms=lambda c: {"float32": 20.0, "mixed_bfloat16": 14.0}.get(c.policy, 18.0),
                   memory=lambda c: {"float32": 1000, "mixed_bfloat16": 900}.get(c.policy, 500),
                   seed=2)


def test_the_memory_objective_exports_the_smallest_stable_config_with_its_speed(tmp_path):
    scheduler, outcome, _, _ = tune(space_file(tmp_path, PURE), _memory_machine(), tmp_path,
                                    trials=4, objective="memory")
    assert outcome.winner.config.policy == "bfloat16"
    assert outcome.winner.config.weight_update == "nearest"  # same memory: the simpler one
    assert outcome.decision.explanation.startswith("objective memory: the smallest training "
                                                   "memory")
    estimate = outcome.decision.estimate  # re-measured against float32: about 20/18
    assert estimate.rounds >= 4 and estimate.low < 20 / 18 < estimate.high


@pytest.mark.parametrize("slack, policy", [(0.10, "bfloat16"), (0.90, "mixed_bfloat16")])
def test_the_balanced_objective_reads_the_pick_off_the_front(tmp_path, slack, policy):
    scheduler, outcome, _, _ = tune(space_file(tmp_path, PURE), _memory_machine(), tmp_path,
                                    trials=4, objective="balanced", memory_slack=slack)
    assert outcome.winner.config.policy == policy
    fronts = [line for line in outcome.objective_lines if line.startswith("front: ")]
    assert len(fronts) == 2 and "mixed_bfloat16" in " ".join(fronts)


def test_a_finalist_that_cannot_clear_the_bar_stops_being_timed(tmp_path):
    """Once a finalist's whole interval lies below float32 + 3% (it cannot be picked) while
    another's still reaches it, it is dropped and the later rounds time only the others (with
    the settled-pick stop off: it would end the rounds where the drop leaves one finalist)."""
    from tuner.run.plan import Remeasurement

    # 1.03x: its interval straddles the bar, so the rounds go on (at 1.02x every interval
    # soon lies below it, and the rounds stop before the minimum: no finalist can be picked).
    true = {(): 20.0 / 1.03, ("softmax",): 20.0 / 0.98}
    dropped_runs = 0
    for seed in range(8):
        (tmp_path / str(seed)).mkdir()
        machine = Machine(step_ms=lambda c: 20.0 if c.policy == "float32"
                          else true[c.float32.groups], drift=0.02, jitter=0.01, seed=seed)
        scheduler, outcome, _, _ = tune(space_file(tmp_path / str(seed), MIXED), machine,
                                        tmp_path / str(seed), trials=3, seed=seed,
                                        remeasurement=Remeasurement(
                                            max_rounds=8, target_half_width=0.01,
                                            time_cap_s=1e9, settle=False))
        notes = [n for n in outcome.notes if "so it cannot be picked" in n]
        rows = {r.number: r for r in scheduler.rows}
        for note in notes:
            number = int(note.split("#", 1)[1].split(" ", 1)[0])
            row = rows[number]
            assert row.estimate.high < 1.03
            after = int(note.split(" after ", 1)[1].split(" ", 1)[0])
            assert len(row.remeasured_rounds) == after    # not timed after its drop
            dropped_runs += after < len(scheduler.baseline.remeasured_rounds)
        assert outcome.winner.config.float32.groups == ()  # never the slower one
    assert dropped_runs >= 3


def test_stable_configs_all_clearly_slower_are_named_as_such(tmp_path):
    """float32 wins without rounds, and the decision says why: not 'no other stable config'.
    (1.55x float32's step: clearly slower, yet inside the early-stop limit, so judged.)"""
    machine = Machine(step_ms=lambda c: 20.0 if c.policy == "float32" else 31.0, seed=2)
    scheduler, outcome, _, _ = tune(space_file(tmp_path, MIXED), machine, tmp_path, trials=3)
    assert outcome.winner is scheduler.baseline
    assert any(r.judgement.stable for r in scheduler.rows[1:])
    assert outcome.decision.explanation == \
        "every stable 16-bit config is clearly slower than float32"
    assert "no other stable config" not in outcome.decision.explanation


FLOAT16 = """
policies: [float32, mixed_float16]
loss_scale: {kinds: [none, dynamic]}
trials: 3
trial: {steps: 20, warmup_steps: 3}
"""


@pytest.mark.parametrize("p01, exported", [(1e-9, "dynamic"), (1e-3, "dynamic")])
def test_a_float16_pick_without_a_loss_scale_needs_evidence(tmp_path, p01, exported):
    """Both float16 configs run as fast. With gradients that float16 flushes at scale 1 the
    unscaled one is not even a finalist; with normal gradients it may be one, but the tie goes
    to Keras's default, the dynamic loss scale."""

    machine = Machine(step_ms=lambda c: 30.0 if c.policy == "float32" else 20.0, seed=4)
    executor = ScriptedExecutor(machine)
    scheduler = scheduler_for(space_file(tmp_path, FLOAT16), executor, tmp_path, trials=3)
    scheduler.plan = scheduler.plan.learn(gradient_p01=p01)
    scheduler.run()
    outcome = remeasure(scheduler)
    assert outcome.winner.config.loss_scale.kind == exported
    unscaled = [n for n in outcome.notes if "out of the finalists" in n]
    assert bool(unscaled) == (p01 < 2**-14)
    if unscaled:
        assert "subnormal in float16 without a loss scale" in unscaled[0]


def test_an_unscaled_float16_pick_states_its_evidence(tmp_path):

    space = FLOAT16.replace("kinds: [none, dynamic]", "kinds: [none]")
    machine = Machine(step_ms=lambda c: 30.0 if c.policy == "float32" else 20.0, seed=4)
    scheduler = scheduler_for(space_file(tmp_path, space), ScriptedExecutor(machine), tmp_path,
                              trials=2)
    scheduler.plan = scheduler.plan.learn(gradient_p01=1e-3)
    scheduler.run()
    outcome = remeasure(scheduler)
    assert outcome.winner.config.loss_scale.kind == "none"
    assert any(n.startswith("the pick has no loss scale: the smallest 1% of gradients (from "
                            "0.001) stay normal") for n in outcome.notes)
    scheduler.plan = scheduler.plan.learn(gradient_p01=None)
    assert remeasure(scheduler).winner is scheduler.baseline   # no evidence: not a finalist


def _rounds_of(outcome) -> int:
    return int(outcome.notes[0].split(" in ", 1)[1].split(" rounds", 1)[0])


@pytest.mark.parametrize("true, far_from_the_bar, rounds_saved", [
    # The digits case: two bf16 finalists that cost the same, both far above float32. The
    # tie rule picks the simpler whatever more rounds show (measured: 40 of 80 rounds saved).
    ({(): 1.48, ("softmax",): 1.48}, True, 30),
    # Both a little slower than float32 stays float32 with more rounds too (the rule that
    # every interval lies below the bar often ends these at the minimum already: 7 saved).
    ({(): 0.95, ("softmax",): 0.94}, True, 4),
    # Close to float32 + 3%: more rounds can decide, so they mostly run on.
    ({(): 1.05, ("softmax",): 1.05}, False, 0),
])
def test_the_rounds_stop_once_more_cannot_change_the_pick(tmp_path, true, far_from_the_bar,
                                                          rounds_saved):
    """The settled-pick stop only saves rounds. Far from the bar, each seed's pick is the one
    the rounds give without it (run to the cap or the width target); near the bar it rarely
    fires, and a pick it makes is never truly slower than the one more rounds make."""
    from tuner.run.plan import Remeasurement

    def true_speedup(config):
        return 1.0 if config.policy == "float32" else true[config.float32.groups]

    settled, saved = 0, 0
    for seed in range(10):
        picks, rounds = [], []
        for settle in (True, False):
            folder = tmp_path / f"{seed}-{settle}"
            folder.mkdir()
            machine = Machine(step_ms=lambda c: 20.0 / true_speedup(c), drift=0.04,
                              jitter=0.02, seed=seed)
            _, outcome, _, _ = tune(space_file(folder, MIXED), machine, folder, trials=3,
                                    seed=seed, remeasurement=Remeasurement(
                                        target_half_width=0.02, time_cap_s=1e9, settle=settle))
            picks.append(outcome.winner.config)
            rounds.append(_rounds_of(outcome))
            settled += settle and "a settled pick" in outcome.notes[0]
        assert rounds[0] <= rounds[1]
        saved += rounds[1] - rounds[0]
        if far_from_the_bar:
            assert picks[0] == picks[1], (seed, picks)
        else:
            assert true_speedup(picks[0]) >= true_speedup(picks[1]), (seed, picks)
    if far_from_the_bar:
        expected = ("mixed_bfloat16", ()) if true[()] > 1.3 else ("float32", ())
        assert (picks[0].policy, picks[0].float32.groups) == expected
        assert saved >= rounds_saved, (settled, saved)
    else:
        assert settled <= 3, settled


def test_the_run_to_run_allowance_makes_the_interval_hold_the_long_run_speedup(tmp_path):
    """Each tune finds the machine at its own level (``level_drift``: the minute-to-minute move
    that one tune's rounds cannot see; on the 2-core Xeon, digits tunes exported 1.35-1.65x at
    +-2-4% while fresh-process A/B read 1.54x). With the allowance the exported interval holds
    the long-run speedup about as often as a 95% interval should; with the rounds alone it
    does not, and that is what the allowance is for. (Rounds as tight as the Xeon's: their
    medians moved 1-2% within a tune.)"""
    def coverage(run_drift: float) -> int:
        held = 0
        for seed in range(20):
            folder = tmp_path / f"{run_drift}-{seed}"
            folder.mkdir()
            machine = Machine(step_ms=lambda c: 30.0 if c.policy == "float32" else 30.0 / 1.45,
                              drift=0.015, level_drift=0.06, seed=seed)
            executor = ScriptedExecutor(machine)
            scheduler = scheduler_for(space_file(folder, MIXED), executor, folder, trials=3,
                                      seed=seed, run_drift=run_drift)
            scheduler.run()
            outcome = remeasure(scheduler)
            estimate = outcome.decision.estimate
            assert outcome.winner.config.policy == "mixed_bfloat16"
            assert estimate.run_drift == run_drift
            held += estimate.low <= 1.45 <= estimate.high
        return held

    with_allowance, rounds_alone = coverage(0.06), coverage(0.0)
    assert with_allowance >= 17 and rounds_alone <= 12, (with_allowance, rounds_alone)


def test_a_memory_pick_slower_than_float32_still_gets_its_rounds(tmp_path):
    """Under the memory objective a pick slower than float32 is still the pick (it saves
    memory): no finalist can clear float32 + 3%, which ends speed rounds early, and its speed
    must still be measured to the minimum of rounds, with its interval.
    Mutation caught: the early "no finalist can clear" stop ending memory and balanced rounds
    too (``self.by_speed and`` dropped in tuner/run/remeasure.py)."""
    machine = Machine(step_ms=lambda c: 20.0 if c.policy == "float32" else 35.0,
                      memory=lambda c: 1000 if c.policy == "float32" else 500, seed=2)
    scheduler, outcome, _, _ = tune(space_file(tmp_path, PURE), machine, tmp_path, trials=4,
                                    objective="memory")
    assert outcome.winner.config.policy != "float32"
    assert _rounds_of(outcome) >= scheduler.plan.remeasurement.min_rounds, outcome.notes
    assert not any("no finalist can clear" in note for note in outcome.notes)
    estimate = outcome.decision.estimate
    assert estimate.low < 20 / 35 < estimate.high


def test_a_finalist_timed_beside_another_is_not_dropped_on_its_search_figure(tmp_path):
    """``below_float32`` drops a finalist the search placed below float32 only where both it
    and float32 ran with the node to themselves: a trial timed beside another reads up to 1.5x
    slow, so its figure says nothing.
    Mutation caught: ``below_float32`` ignoring ``exclusive_timing`` (tuner/run/finalists.py)."""
    from tuner.run.finalists import below_float32

    machine = Machine(step_ms=lambda c: 20.0 if c.policy == "float32" else 40.0, drift=0.0,
                      jitter=0.01, seed=0)
    scheduler, _, _, _ = tune(space_file(tmp_path, MIXED), machine, tmp_path, trials=3)
    slow = [row for row in scheduler.rows if row.config.policy != "float32"]
    kept, notes = below_float32(scheduler.baseline, slow)
    assert kept == [] and len(notes) == len(slow)   # both alone: dropped, each with its line
    for row in slow:
        row.result.exclusive_timing = False
    assert below_float32(scheduler.baseline, slow) == (slow, [])
    for row in slow:
        row.result.exclusive_timing = True
    scheduler.baseline.result.exclusive_timing = False
    assert below_float32(scheduler.baseline, slow) == (slow, [])
