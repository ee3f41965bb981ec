"""How much a run learned, measured against its own noise: the series-level measures the
verdict (tuner.judging.verdict), the judging of each loss of a multi-loss model
(tuner.judging.terms), the sizing and the confirmation share. Pure Python.
"""

from __future__ import annotations

import math
import statistics

NOISE_SIGMAS = 2.0  # a difference within this many standard errors is noise
# How much higher than float32's a trial's end level (training or validation loss) may be,
# relative, besides the noise. Two runs of the same seed and batches drift apart as rounding
# differs: measured on the examples' trials, a mixed_bfloat16 trial ended within +-5% of
# float32's validation loss (digits -5%, audio +2%, transformer +2%), while float32 against
# itself with another seed varied up to 1.45x (transformer) in the same budget. A 25% allowance
# keeps that drift from rejecting a sound config and still rejects the shapes that matter
# (a plateau at 2x, an 11x worse validation loss).
LEVEL_ALLOWANCE = 0.25


def _window(steps: int) -> int:
    """Steps averaged at each end: never a single step (one batch is all noise)."""
    return max(2, min(5, steps // 6))


def loss_decrease(losses: list[float]) -> float | None:
    """Start-of-training loss minus end-of-training loss, each averaged over a few steps."""
    window = _window(len(losses))
    if len(losses) < 2 * window:
        return None
    return statistics.fmean(losses[:window]) - statistics.fmean(losses[-window:])


def decrease_noise(losses: list[float]) -> float:
    """Standard error of ``loss_decrease``, from the losses' own step-to-step scatter.

    Second differences ``l[i+1] - 2 l[i] + l[i-1]`` cancel a locally straight trend and have six
    times the variance of one step's noise; their median absolute deviation keeps the steep
    bend at the start of training from passing for noise. A window mean of ``w`` steps has
    ``1/w`` of the variance, and the decrease is a difference of two window means.
    """
    window = _window(len(losses))
    bends = [a - 2.0 * b + c for a, b, c in zip(losses, losses[1:], losses[2:])]
    if len(bends) < 3:
        return 0.0
    centre = statistics.median(bends)
    mad = statistics.median(abs(v - centre) for v in bends)
    step_sigma = 1.4826 * mad / math.sqrt(6.0)
    return step_sigma * math.sqrt(2.0 / window)


def standard_error(values: list[float]) -> float:
    """The standard error of the mean of ``values`` (their finite part)."""
    finite = [v for v in values if math.isfinite(v)]
    return statistics.stdev(finite) / math.sqrt(len(finite)) if len(finite) >= 2 else 0.0


def level_gap(what: str, own: float, reference: float, noise: float,
               allowance: float) -> str:
    """``what`` ended above ``reference`` by more than the noise and the relative allowance."""
    margin = max(noise, allowance * abs(reference))
    if own - reference <= margin:
        return ""
    times = f"{own / reference:.2g}x; " if reference > 0 else ""
    return (f"{what} {own:.3g} vs float32's {reference:.3g} ({times}noise +-{noise:.2g}, "
            f"allowance {allowance:.0%})")


def barely_learned(base: float | None, noise: float, steps: int) -> str:
    amount = "no measurable decrease" if base is None else \
        f"decrease {base:.3g} within its noise (+-{NOISE_SIGMAS * noise:.2g})"
    return (f"float32 itself barely learned in {steps} steps ({amount}): trials are judged "
            "on ending no worse than float32, not on a ratio")
