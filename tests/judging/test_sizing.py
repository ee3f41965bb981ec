"""How many steps a sized trial runs (tuner.judging.sizing): the rule, on plain lists."""

import math
import random

import pytest

from tuner.judging.sizing import Sizing, enough, loss_resolution, timing_spread

RULE = Sizing(floor=30, min_steps=8, cap_s=5.0, max_steps=2000, tolerance=0.9)


def steady(steps: int, step_ms: float = 10.0, jitter: float = 0.001, seed: int = 0):
    """Step times (the first is the trace) and a loss falling steadily with a little noise."""
    rng = random.Random(seed)
    times = [500.0] + [step_ms * (1 + rng.uniform(-jitter, jitter)) for _ in range(steps - 1)]
    losses = [2.0 * math.exp(-i / 200) + rng.gauss(0, 1e-3) for i in range(steps)]
    return losses, times


def test_nothing_stops_a_run_below_its_floor_except_the_cap():
    losses, times = steady(29)
    assert enough(losses, times, 5, RULE) is None        # precise, but below the floor
    slow_losses, slow_times = steady(12, step_ms=600.0)   # 6.6 s of training in 12 steps
    assert enough(slow_losses, slow_times, 5, RULE) == "the time cap (5 s of training)"
    assert enough(slow_losses[:7], slow_times[:7], 5, RULE) is None  # never below min_steps


def test_a_fast_steady_model_stops_once_its_timed_steps_span_the_minimum_time():
    losses, times = steady(2000, step_ms=10.0)
    stops = next(n for n in range(1, 2001) if enough(losses[:n], times[:n], 5, RULE))
    # 1 s of timed steps at 10 ms needs 100 timed steps after the 5 warm-up steps.
    assert stops == 105
    assert enough(losses[:stops], times[:stops], 5, RULE).startswith(
        "its median step time known to +-")


def test_noisy_step_times_need_more_steps_than_steady_ones():
    steady_losses, steady_times = steady(2000, jitter=0.001)
    noisy_losses, noisy_times = steady(2000, jitter=0.2, seed=1)

    def stop(losses, times):
        return next(n for n in range(1, 2001) if enough(losses[:n], times[:n], 5, RULE))

    assert stop(noisy_losses, noisy_times) > stop(steady_losses, steady_times)
    n = stop(noisy_losses, noisy_times)
    assert enough(noisy_losses[:n], noisy_times[:n], 5, RULE).startswith("its median step time")
    assert timing_spread(noisy_times[5:n]) <= RULE.timing_precision


def test_a_loss_that_has_not_moved_beyond_its_noise_keeps_the_run_going_to_the_cap():
    rng = random.Random(3)
    flat = [1.0 + rng.gauss(0, 0.05) for _ in range(600)]
    times = [500.0] + [10.0] * 599
    assert loss_resolution(flat, 0.9) is None or loss_resolution(flat, 0.9) < 1.0
    assert all(enough(flat[:n], times[:n], 5, RULE) is None for n in range(1, 500))
    assert enough(flat, times, 5, RULE) == "the time cap (5 s of training)"


def test_loss_resolution_is_the_verdicts_margin_against_twice_the_tolerated_shortfall():
    losses = [2.0 - 0.01 * i for i in range(60)]           # noiseless: resolved at once
    assert loss_resolution(losses, 0.9) == math.inf
    rng = random.Random(4)
    noisy = [2.0 - 0.01 * i + rng.gauss(0, 0.02) for i in range(60)]
    loose, strict = loss_resolution(noisy, 0.5), loss_resolution(noisy, 0.95)
    assert loose == pytest.approx(strict * 10)             # 2 * (1 - tol) scales it


def test_the_most_steps_end_any_run():
    losses = [1.0] * 2000
    times = [500.0] + [0.01] * 1999
    assert enough(losses, times, 5, RULE) == "the most steps a trial runs (2000)"


def test_the_rule_travels_as_plain_data():
    assert Sizing.from_dict(RULE.to_dict()) == RULE
