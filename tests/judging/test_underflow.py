"""Gradient underflow read from exponent histograms: at any loss scale, per layer."""

import pytest

from tuner.judging.underflow import flushed_fraction, gradient_histograms, underflow_note

# 10 values in [2^-30, 2^-29), 30 in [2^-26, 2^-25), 60 in [2^-3, 2^-2)
HISTOGRAM = {"-30": 10, "-26": 30, "-3": 60}


def test_the_flushed_share_moves_with_the_scale():
    assert flushed_fraction({"log2_counts": HISTOGRAM}, 1.0) == pytest.approx(0.4)
    assert flushed_fraction({"log2_counts": HISTOGRAM}, 2.0**5) == pytest.approx(0.1)
    assert flushed_fraction({"log2_counts": HISTOGRAM}, 2.0**6) == 0.0  # 2^-30 * 2^6 = 2^-24
    assert flushed_fraction({"log2_counts": {}}, 1.0) == 0.0
    assert flushed_fraction({"abs_max": 1.0}, 1.0) is None   # diagnostics without histograms


def test_the_note_names_the_layers_that_lose_most():
    histograms = {"dense": HISTOGRAM, "head": {"-3": 100}, "tiny": {"-40": 1, "-2": 99}}
    note = underflow_note(histograms, 1.0)
    assert note == "weight gradients float16 flushes to zero at scale 1: dense (40%)"
    assert underflow_note(histograms, 2.0**16) == ""
    many = {f"layer{i}": {"-30": 1} for i in range(5)}
    assert underflow_note(many, 1.0).endswith(" and 2 more")


def test_histograms_are_taken_from_the_layers_with_weight_gradients():
    diagnostics = {"layers": [
        {"layer": "dense", "weight_gradient": {"log2_counts": HISTOGRAM}},
        {"layer": "relu", "weight_gradient": None},
        {"layer": "old", "weight_gradient": {"underflow_fraction": 0.5}}]}
    assert gradient_histograms(diagnostics) == {"dense": HISTOGRAM}
