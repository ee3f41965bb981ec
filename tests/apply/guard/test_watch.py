"""The guard's step arithmetic, without TensorFlow: per-step losses from a running mean, and
spikes judged against the run's own noise."""

import math

import numpy as np
import pytest

from tuner.apply.guard.watch import LossSeries, SpikeWatch


def test_step_losses_come_from_the_running_mean_differences():
    series = LossSeries()
    steps = [4.0, 2.0, 6.0]
    total = 0.0
    found = []
    for count, loss in enumerate(steps, start=1):
        total += loss
        found.append(series.step_loss(total, float(count), total / count))
    assert found == pytest.approx(steps)


def test_a_tracker_that_does_not_count_falls_back_to_the_logged_loss():
    series = LossSeries()
    assert series.step_loss(None, None, 3.5) == 3.5
    assert series.step_loss(0.0, 0.0, 7.0) == 7.0  # count never advances: logged per step


def test_a_non_finite_total_is_a_non_finite_step():
    series = LossSeries()
    series.step_loss(2.0, 1.0, 2.0)
    assert math.isinf(series.step_loss(math.inf, 2.0, math.inf))


def test_noisy_but_steady_losses_never_spike_and_a_jump_does():
    rng = np.random.default_rng(0)
    watch = SpikeWatch()
    losses = np.exp(rng.normal(0.0, 0.3, size=500)) * np.linspace(2.0, 1.0, 500)
    assert not any(watch.is_spike(float(loss)) for loss in losses)
    assert watch.is_spike(float(losses[-1] * 400))
    assert not watch.is_spike(float(losses[-1]))  # the spike was not kept in the window


def test_the_bar_follows_the_noise_not_a_fixed_factor():
    quiet, loud = SpikeWatch(), SpikeWatch()
    rng = np.random.default_rng(1)
    for _ in range(100):
        quiet.is_spike(float(np.exp(rng.normal(0, 0.01))))
        loud.is_spike(float(np.exp(rng.normal(0, 0.5))))
    assert quiet.threshold() < loud.threshold()
    assert quiet.threshold() == pytest.approx(2.0, rel=0.05)  # the floor: min_ratio


def test_bad_settings_say_what_and_the_values():
    with pytest.raises(ValueError, match="sigmas=0"):
        SpikeWatch(sigmas=0)
