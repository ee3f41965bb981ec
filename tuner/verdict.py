"""Is a trial stable, compared with the float32 baseline? Pure Python, no TensorFlow.

Stable iff: every loss finite; the loss scale never fell to its floor; skipped steps within a
bound; and the trial achieved at least ``min_loss_decrease_ratio`` of the loss decrease the
float32 baseline achieved with the same seed, data and step budget.
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass

from tuner.trial_types import TrialOutcome, TrialResult


class Verdict(str, enum.Enum):
    STABLE = "stable"
    UNSTABLE = "unstable"
    FAILED = "failed"          # did not train (error, crash, timeout)
    STOPPED_SLOW = "stopped_slow"  # stability unknown: stopped for being clearly slower


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str                       # one line; empty when stable
    loss_decrease_ratio: float | None
    median_step_ms: float | None

    @property
    def stable(self) -> bool:
        return self.verdict is Verdict.STABLE


def _window(steps: int) -> int:
    return max(1, min(5, steps // 6))


def loss_decrease(losses: list[float]) -> float | None:
    """Start-of-training loss minus end-of-training loss, each averaged over a few steps."""
    if len(losses) < 2:
        return None
    window = _window(len(losses))
    return statistics.fmean(losses[:window]) - statistics.fmean(losses[-window:])


def judge(result: TrialResult, baseline: TrialResult | None, *, floor: float,
          max_skipped_fraction: float, min_loss_decrease_ratio: float,
          expected_steps: int) -> Judgement:
    median = result.median_step_ms
    if result.outcome is TrialOutcome.FAILED:
        return Judgement(Verdict.FAILED, result.failure_message or "failed", None, median)
    if result.outcome is TrialOutcome.STOPPED_SLOW:
        return Judgement(Verdict.STOPPED_SLOW, result.stop_reason or "stopped early: too slow",
                         None, median)
    if result.first_non_finite_step is not None or not all(map(math.isfinite, result.losses)):
        step = result.first_non_finite_step
        if step is None:
            step = next(i for i, v in enumerate(result.losses) if not math.isfinite(v))
        where = f" (first non-finite output: layer {result.failure_layer})" \
            if result.failure_layer else " (the forward pass is finite: gradients or updates " \
                                         "overflowed)"
        return Judgement(Verdict.UNSTABLE, f"loss non-finite at step {step}{where}", None,
                         median)
    scales = [s for s in result.loss_scales if s is not None]
    if scales and min(scales) <= floor:
        first = next(i for i, s in enumerate(result.loss_scales) if s is not None and s <= floor)
        return Judgement(Verdict.UNSTABLE, f"loss scale fell to its floor ({floor:g}) after "
                         f"{first + 1} steps", None, median)
    if result.skipped_steps > max_skipped_fraction * expected_steps:
        return Judgement(Verdict.UNSTABLE, f"skipped {result.skipped_steps} of "
                         f"{len(result.losses)} steps (non-finite gradients); at most "
                         f"{max_skipped_fraction:.0%} allowed", None, median)
    ratio = _decrease_ratio(result, baseline)
    if ratio is not None and ratio < min_loss_decrease_ratio:
        return Judgement(Verdict.UNSTABLE, f"reached {ratio:.0%} of float32's loss decrease "
                         f"(needs {min_loss_decrease_ratio:.0%})", ratio, median)
    if ratio is None and baseline is not None and baseline is not result:
        return Judgement(Verdict.UNSTABLE, "cannot compare with the float32 baseline (it did "
                         "not train)", None, median)
    return Judgement(Verdict.STABLE, "", ratio, median)


def _decrease_ratio(result: TrialResult, baseline: TrialResult | None) -> float | None:
    if baseline is None or baseline is result:
        return 1.0
    base = loss_decrease(baseline.losses)
    mine = loss_decrease(result.losses)
    if base is None or mine is None or not math.isfinite(base):
        return None
    if base <= 0:
        # The baseline did not learn within the budget: fall back to "no worse than it".
        return 1.0 if mine >= base - 1e-3 * max(1.0, abs(statistics.fmean(baseline.losses))) \
            else 0.0
    return mine / base
