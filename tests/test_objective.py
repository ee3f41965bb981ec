"""What "best" means beyond speed: the least memory, or a balance read off the Pareto front."""

import pytest

from tuner.apply.config import Float32Placement, PrecisionConfig
from tuner.judging.objective import Point, pareto_front, pick

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
