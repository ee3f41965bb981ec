"""The rules that keep noise out of decisions: intervals, verdicts on tiny decreases, early
stopping, loss-scale floors, the run plan."""

import math
import random
import statistics
from pathlib import Path

import pytest

from tuner.apply.config import Epsilon, LossScale, PrecisionConfig
from tuner.errors import ConfigError, SearchSpaceError, UsageError
from tuner.judging.decision import Candidate, complexity, decide
from tuner.judging.noise import (
    PooledNoise,
    SpeedupEstimate,
    paired_speedup,
    speedup_from_log_ratios,
)
from tuner.judging.verdict import Verdict, _window, judge
from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec

RULES = dict(floor=1.0, max_skipped_fraction=0.2, min_loss_decrease_ratio=0.9)


# -- intervals ----------------------------------------------------------------------------------
def test_three_agreeing_rounds_do_not_make_a_tight_interval_alone():
    # Rounds that agree to 0.1% but a pool that knows the machine drifts by ~10%.
    lucky = [math.log(1.20), math.log(1.201), math.log(1.199)]
    pooled = PooledNoise.of([lucky, [0.0, 0.2, -0.2], [0.1, -0.1, 0.0]])
    estimate = speedup_from_log_ratios(lucky, pooled)
    assert estimate.low < 1.03 < estimate.high  # the pooled spread wins over the lucky one
    alone = speedup_from_log_ratios(lucky)
    assert alone.relative_half_width < 0.01


def test_paired_rounds_cancel_drift_that_hits_both_sides():
    base = [[20.0 * d] * 10 for d in (1.0, 1.3, 0.8, 1.1)]   # the machine speeds up and slows
    cand = [[10.0 * d] * 10 for d in (1.0, 1.3, 0.8, 1.1)]
    estimate = paired_speedup(base, cand)
    assert estimate.ratio == pytest.approx(2.0) and estimate.relative_half_width < 1e-9


def test_one_round_has_no_known_bound():
    estimate = speedup_from_log_ratios([math.log(1.5)])
    assert not estimate.clears(1.0) and estimate.high == math.inf


def test_interval_covers_the_truth_about_95_percent_of_the_time():
    rng = random.Random(7)
    hits = 0
    for _ in range(400):
        ratios = [math.log(1.3) + rng.gauss(0, 0.07) for _ in range(4)]
        estimate = speedup_from_log_ratios(ratios)
        hits += estimate.low <= 1.3 <= estimate.high
    assert 0.90 <= hits / 400 <= 0.99


def test_estimate_round_trips_and_refuses_an_interval_without_its_estimate():
    estimate = SpeedupEstimate(1.4, 1.3, 1.5, 5)
    assert SpeedupEstimate.from_dict(estimate.to_dict()) == estimate
    assert estimate.describe() == "1.40x [1.30-1.50]"
    with pytest.raises(ValueError, match="must hold its estimate"):
        SpeedupEstimate(1.4, 1.45, 1.5, 3)


def test_two_rounds_far_apart_give_an_interval_that_reads_back():
    # bench's rounds under load (3.73 ms and 1.08 ms for float32): two log ratios far apart,
    # a t interval from 1 degree of freedom, its low end 1e-5. Rounded to four decimals it was
    # 0 and the record could not be read back (0 < low).
    estimate = speedup_from_log_ratios([math.log(3.73 / 1.08), math.log(1.08 / 2.00)])
    assert 0 < estimate.low < 1e-4 and estimate.high > 1e4
    again = SpeedupEstimate.from_dict(estimate.to_dict())
    assert 0 < again.low <= again.ratio <= again.high
    assert again.low == pytest.approx(estimate.low, rel=1e-3)


def test_the_run_to_run_allowance_widens_an_interval_in_logs_and_keeps_its_rounds():
    rounds = SpeedupEstimate(1.40, 1.35, 1.45, 6)
    widened = rounds.across_runs(0.06)
    assert widened.ratio == 1.40 and widened.rounds == 6
    # Each side's half-width in logs: the rounds' and 1.96 sd, in quadrature.
    below = math.hypot(math.log(1.40 / 1.35), 1.96 * 0.06)
    assert widened.low == pytest.approx(1.40 * math.exp(-below))
    assert widened.high == pytest.approx(1.40 * math.exp(math.hypot(math.log(1.45 / 1.40),
                                                                    1.96 * 0.06)))
    assert (widened.rounds_low, widened.rounds_high, widened.run_drift) == (1.35, 1.45, 0.06)
    assert widened.rounds_interval == rounds.rounds_interval == (1.35, 1.45)
    assert widened.across_runs(0.06) is widened          # never widened twice
    assert rounds.across_runs(0.0) is rounds
    identity = SpeedupEstimate.identity(4)                 # float32 against itself: exact
    assert identity.across_runs(0.06) is identity
    unknown = SpeedupEstimate(1.2, 1e-9, math.inf, 1)      # one round: no bound either way
    assert unknown.across_runs(0.06).high == math.inf
    restored = SpeedupEstimate.from_dict(widened.to_dict())
    assert (restored.run_drift, restored.rounds_low, restored.rounds_high) == (0.06, 1.35, 1.45)
    assert "this run's rounds alone: 1.35-1.45" in widened.describe_allowance()
    assert rounds.describe_allowance() == ""


def test_a_gain_the_run_to_run_drift_could_erase_is_a_tie():
    """1.10x [1.07-1.13] clears float32 + 3% in its rounds, but not once the level's move
    between runs (sd 6%) is allowed for; a 1.5x gain clears either way, exported widened."""
    small = cand(2, "mixed_bfloat16", 1.10, 1.07, 1.13)
    assert decide(0, [small]).winner == 2
    tie = decide(0, [small], run_drift=0.06)
    assert tie.winner == 0 and tie.tie and "run-to-run drift" in tie.explanation
    large = decide(0, [cand(3, "mixed_bfloat16", 1.50, 1.46, 1.54)], run_drift=0.06)
    assert large.winner == 3 and large.estimate.low < 1.46 and large.estimate.run_drift == 0.06
    assert "this run's rounds alone: 1.46-1.54" in large.explanation
    # Between finalists the rounds decide: both ran in them, the level's move is common.
    faster = cand(4, "mixed_bfloat16", 1.60, 1.56, 1.64, epsilon=Epsilon(backend=1e-4))
    simpler = cand(5, "mixed_bfloat16", 1.45, 1.42, 1.48)
    assert decide(0, [faster, simpler], run_drift=0.06).winner == 4


# -- the winner rule ------------------------------------------------------------------------
def cand(number, policy, ratio, low, high, **config):
    return Candidate(number, PrecisionConfig(policy, **config),
                     SpeedupEstimate(ratio, low, high, 4))


def test_gain_inside_the_noise_is_a_tie_that_float32_wins():
    decision = decide(0, [cand(2, "mixed_bfloat16", 1.08, 1.01, 1.15)])
    assert decision.winner == 0 and decision.tie
    assert "no config beats float32 beyond noise" in decision.explanation


def test_among_overlapping_gains_the_simplest_wins():
    from tuner.apply.config import Float32Placement

    faster = cand(3, "mixed_bfloat16", 1.50, 1.40, 1.60,
                  float32=Float32Placement(groups=("softmax",)))
    simpler = cand(4, "mixed_bfloat16", 1.45, 1.38, 1.52)
    decision = decide(0, [faster, simpler])
    assert decision.winner == 4 and decision.tie and "tie within noise" in decision.explanation
    clearly = cand(5, "mixed_float16", 2.0, 1.9, 2.1)
    assert decide(0, [faster, simpler, clearly]).winner == 5


def test_simplicity_order():
    from tuner.apply.config import Epsilon, Float32Placement

    order = [PrecisionConfig(), PrecisionConfig(epsilon=Epsilon(1e-4)),
             PrecisionConfig("mixed_bfloat16"),
             PrecisionConfig("mixed_bfloat16", float32=Float32Placement(("softmax",))),
             # Under float16, Keras's own default (a dynamic loss scale) is the simple one.
             PrecisionConfig("mixed_float16", LossScale("dynamic")),
             PrecisionConfig("mixed_float16"),
             PrecisionConfig("mixed_float16", LossScale("fixed", value=1024.0))]
    assert sorted(order, key=complexity) == order


# -- verdicts on tiny decreases ---------------------------------------------------------------
def result(losses, **extra):
    return TrialResult(number=1, outcome=TrialOutcome.COMPLETED, losses=list(losses),
                       step_times_ms=[10.0] * len(losses), loss_scales=[None] * len(losses),
                       warmup_steps=3, **extra)


def noisy(start, slope, sigma, steps=20, seed=0):
    rng = random.Random(seed)
    return [start - slope * i + rng.gauss(0, sigma) for i in range(steps)]


def test_when_float32_barely_learned_the_verdict_says_so_and_does_not_divide_tiny_numbers():
    baseline = result(noisy(0.7, 0.00003, 0.01))
    trial = result(noisy(0.7, 0.00002, 0.01, seed=1))
    judgement = judge(trial, baseline, expected_steps=20, **RULES)
    assert judgement.verdict is Verdict.STABLE, judgement
    assert "float32 itself barely learned" in judgement.note
    assert judgement.loss_decrease_ratio is None
    worse = result([v + 0.2 for v in noisy(0.7, 0.00002, 0.01, seed=1)])
    judgement = judge(worse, baseline, expected_steps=20, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE and "above float32's" in judgement.reason


def test_a_shortfall_inside_the_noise_is_not_instability():
    baseline = result(noisy(2.0, 0.01, 0.05))
    close = result(noisy(2.0, 0.0085, 0.05))
    assert judge(close, baseline, expected_steps=20, **RULES).stable
    stalled = result(noisy(2.0, 0.001, 0.05, seed=3))
    assert judge(stalled, baseline, expected_steps=20, **RULES).verdict is Verdict.UNSTABLE


def test_the_averaging_window_is_never_one_step():
    assert min(_window(n) for n in range(4, 60)) == 2


# -- early stopping ---------------------------------------------------------------------------
def early(times, limit, steps=30, warmup=5):
    from tuner.judging.early_stop import too_slow_reason

    spec = TrialSpec(1, "t.py", {}, steps, warmup, stop_if_slower_than_ms=limit)
    partial = TrialResult(1, TrialOutcome.COMPLETED, step_times_ms=list(times),
                          warmup_steps=warmup)
    return too_slow_reason(partial, spec, len(times) - 1, times[-1])


def test_warmup_steps_and_single_hiccups_never_stop_a_trial():
    assert early([500.0, 100.0], limit=10.0) == ""                    # warm-up, even 50x over
    assert early([500.0] + [9.0] * 8 + [200.0], limit=10.0) == ""     # one hiccup after it


def test_a_stall_of_a_few_steps_does_not_stop_a_run_that_was_fast_before_it():
    # The machine busy for a moment: three steps at 5x, 20x and 50x the limit after eight
    # within it. The same steps from a run slow throughout stop it.
    for stall in ([50.0] * 3, [500.0, 200.0, 50.0], [40.0] * 5):
        assert early([500.0] * 5 + [9.0] * 8 + stall, limit=10.0) == ""
    assert "all took over 3x" in early([500.0] * 5 + [45.0] * 5 + [50.0] * 3, limit=10.0)


def test_hopeless_and_clearly_slow_trials_stop():
    assert "all took over 3x" in early([500.0] * 5 + [40.0] * 3, limit=10.0)
    slow = [500.0] * 5 + [13.0] * 12
    assert "fastest quarter" in early(slow, limit=10.0)
    assert early([500.0] * 5 + [10.5] * 12, limit=10.0) == ""  # a near-miss runs on


# -- loss-scale floors ----------------------------------------------------------------------------
def test_initial_scale_must_be_above_the_floor():
    with pytest.raises(ConfigError, match="must start above its floor"):
        PrecisionConfig("mixed_float16", LossScale("dynamic", initial_scale=1.0, floor=1.0))


def test_space_refuses_initial_scales_at_the_floor_and_auto_never_recommends_it(tmp_path):
    from tuner.search.space_files import load_space

    bad = tmp_path / "bad.yaml"
    bad.write_text("loss_scale: {kinds: [dynamic], initial_scales: [1], floor: 1}\n")
    with pytest.raises(SearchSpaceError, match="must be above the floor"):
        load_space(str(bad))
    auto = tmp_path / "auto.yaml"
    auto.write_text("policies: [float32, mixed_float16]\n"
                    "loss_scale: {kinds: [dynamic], initial_scales: [auto], floor: 1}\n")
    space = load_space(str(auto)).with_diagnostics([], recommended_scale=1.0)
    assert space.initial_scales == (2.0, 16.0)   # 2^-4 and 2^0 raised to twice the floor


# -- the run plan -------------------------------------------------------------------------------
def test_plan_is_resolved_once_and_a_resume_keeps_its_settings(tmp_path):
    from tuner.run.options import TuneOptions
    from tuner.run.plan import resolve

    options = TuneOptions(task=tmp_path / "t.py", run_dir=tmp_path / "run", space="quick")
    plan = resolve(options, None)
    assert (plan.trials, plan.steps, plan.seed, plan.tolerance) == (6, 30, 0, 0.9)
    with pytest.raises(AttributeError):
        plan.trials = 3  # frozen
    previous = {**plan.settings(), "trials": 4, "steps": 12, "status": "running"}
    resumed = resolve(TuneOptions(task=options.task, run_dir=options.run_dir), previous)
    assert (resumed.trials, resumed.steps, resumed.resume) == (4, 12, True)
    with pytest.raises(UsageError, match="--steps 20 differs"):
        resolve(TuneOptions(task=options.task, run_dir=options.run_dir, steps=20), previous)
    with pytest.raises(UsageError, match="--steps must exceed"):
        resolve(TuneOptions(task=options.task, run_dir=options.run_dir, steps=6), None)
    with pytest.raises(UsageError, match="cannot be combined"):
        resolve(TuneOptions(task=options.task, run_dir=options.run_dir, trials=3,
                            exhaustive=True), None)
    assert resolve(TuneOptions(task=Path("t.py"), run_dir=options.run_dir, exhaustive=True),
                   None).trials == plan.space.size()


def test_a_plan_without_steps_sizes_its_baseline_and_a_resume_keeps_the_sized_count(tmp_path):
    from tuner.run.options import TuneOptions
    from tuner.run.plan import resolve

    options = TuneOptions(task=tmp_path / "t.py", run_dir=tmp_path / "run", space="quick",
                          trial_seconds=2.5)
    plan = resolve(options, None)
    sizing = plan.learned.sizing
    assert sizing is not None and (sizing.floor, sizing.cap_s) == (30, 2.5)
    assert sizing.min_steps == plan.warmup_steps + 3 and plan.learned.batch_pool == 50
    fixed = resolve(TuneOptions(task=options.task, run_dir=options.run_dir, steps=40), None)
    assert fixed.learned.sizing is None and fixed.learned.batch_pool == 40
    assert fixed.describe_steps() == "40 steps"
    # Killed before the baseline finished: the resume sizes it again, by the same rule.
    pending = {**plan.settings(), "status": "running"}
    again = resolve(TuneOptions(task=options.task, run_dir=options.run_dir), pending)
    assert again.learned.sizing == plan.learned.sizing and again.steps == 30
    # Sized: the resume trains the sized count, on the same pool of batches.
    sized = {**plan.sized(140, "the time cap").settings(), "status": "running"}
    resumed = resolve(TuneOptions(task=options.task, run_dir=options.run_dir), sized)
    assert (resumed.learned.sizing, resumed.steps, resumed.learned.sized_by,
            resumed.learned.batch_pool) == \
        (None, 140, "the time cap", 50)
    with pytest.raises(UsageError, match="a resumed run keeps how its trials were sized"):
        resolve(TuneOptions(task=options.task, run_dir=options.run_dir, trial_seconds=3), sized)


# -- search-phase intervals: dropping finalists that are clearly behind ---------------------------
def test_the_median_interval_covers_the_median_and_narrows_with_samples():
    from tuner.judging.noise import median_interval

    rng = random.Random(3)
    few = [rng.gauss(10.0, 1.0) for _ in range(8)]
    many = [rng.gauss(10.0, 1.0) for _ in range(400)]
    for samples in (few, many):
        low, high = median_interval(samples)
        assert low <= statistics.median(samples) <= high
    assert median_interval(many)[1] - median_interval(many)[0] < \
        median_interval(few)[1] - median_interval(few)[0]
    assert median_interval([4.0]) == (4.0, 4.0)


def test_a_finalist_is_dropped_only_when_clearly_beyond_the_run_drift():
    from types import SimpleNamespace

    from tuner.judging.noise import SEARCH_DRIFT
    from tuner.run.finalists import clearly_behind

    def row(number, ms, policy="mixed_bfloat16"):
        steps = [ms * (1 + 0.01 * ((i % 5) - 2)) for i in range(20)]
        return SimpleNamespace(number=number, config=PrecisionConfig(policy),
                               result=SimpleNamespace(timed_steps_ms=steps))

    leader, near, far = row(1, 10.0), row(2, 10.0 * SEARCH_DRIFT * 0.98), row(3, 20.0)
    kept, notes = clearly_behind(leader, [leader, near, far])
    assert kept == [leader, near]
    (note,) = notes
    assert note.startswith("dropped #3 (mixed_bfloat16) before the re-measurement") \
        and "#1's" in note and "15% drift" in note
