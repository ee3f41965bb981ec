"""Per-step series in MLflow: at most the points MLflow's charts draw, the spikes kept."""

import math

from tuner.records.mlflow_text import CHART_POINTS, chart_steps


def test_a_short_series_is_logged_whole_its_missing_steps_left_out():
    values = [1.0, None, 0.5, 0.25]
    assert chart_steps(values) == [0, 2, 3]
    assert chart_steps([0.1] * CHART_POINTS) == list(range(CHART_POINTS))


def test_a_long_series_keeps_its_ends_each_stretchs_peak_and_every_kind_of_spike():
    steps = 1054                              # house_prices' trials: 1054 steps each
    values: list[float | None] = [1.0 / (1 + step) for step in range(steps)]
    values[10] = 5.0                          # a loss spike early on
    values[611] = math.nan                    # a non-finite step inside a stretch
    values[612] = 7.0                         # beside it, a higher finite value
    values[700] = math.inf
    values[1000] = None                       # a step without a value
    kept = chart_steps(values)
    assert len(kept) <= CHART_POINTS + 1
    assert kept == sorted(set(kept))          # each step once, in order (MLflow's x axis)
    assert kept[0] == 0 and kept[-1] == steps - 1
    assert {10, 611, 700} <= set(kept)
    assert 1000 not in kept
    # Spread over the whole training: no gap longer than a stretch (1054 / 160 -> 7 steps).
    assert max(b - a for a, b in zip(kept, kept[1:])) <= 2 * math.ceil(steps / 160)
    # Stretches of 65 steps (limit 20): in 585-649 the NaN ranks above the higher 7.0.
    few = chart_steps(values[:650], limit=20)
    assert 611 in few and 612 not in few and len(few) <= 21
