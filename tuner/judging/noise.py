"""How sure is a speedup? Paired timing rounds, and an interval that is honest with few of them.

A speedup is measured in *rounds*: in each round float32 and every finalist train once, back to
back on the same otherwise idle worker, so that a slow patch of the machine (another tenant, a
thermal dip, the page cache) hits them alike. Each round gives one log ratio of medians,
``log(float32 median / candidate median)``; the speedup is the geometric mean of those ratios.

Its interval is a Student-t interval over the rounds, not a bootstrap: with the three to eight
rounds a re-measurement can afford, a bootstrap only spans the rounds it saw and three rounds
that happen to agree look precise (tried: a +-4.7% "interval" from runs that drifted by 30%).
The t quantile pays for few rounds, and the spread used is the larger of the candidate's own
and the spread pooled over every finalist of the same re-measurement (the machine's noise is
shared by all of them), so one lucky candidate cannot claim a tight interval.

Stopping as soon as an interval is narrow favours rounds that happened to agree. With a minimum
of 3 rounds, the only intervals (2 of 12 finalists over 6 tunes) that missed an independent A/B
in fresh processes came from runs that stopped at 3; the minimum is now 4
(``tuner.run.plan.Remeasurement``).

The rounds also stop once more of them cannot change the pick (``projected_speedup``): with
each estimate where it is and its spread as measured, the intervals the round cap could reach
at the narrowest give the same decision as today's (``tuner.run.remeasure``).

A/A runs of float32 against itself varied 0.965-1.133 on these 2-core machines: a single pair
of medians cannot tell a 5% gain from noise.

**Another run.** The rounds take about a minute, in one worker; what moves the whole level from
one minute to the next is common to all of them, so their interval cannot hold it. On the
2-core Xeon, eight digits tunes exported the same pick at 1.35-1.65x with intervals of +-2-4%,
while A/B runs in fresh processes read 1.54-1.56x: three intervals in eight held it. So the
speedup compared with float32 (the pick's bar, and the figure exported) is widened by a
run-to-run allowance (``SpeedupEstimate.across_runs``): the between-run standard deviation of the
log speedup, ``RUN_DRIFT_SD`` as measured by ``benchmarks/run_to_run.py`` (its results file),
added in quadrature to the rounds' half-width. Comparisons between finalists are not widened:
they ran in the same rounds, so the level's move is common to both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

CONFIDENCE = 0.95
_UNKNOWN_LOW = 1e-9  # the lower end of an interval nothing is known about (it must stay > 0)
NORMAL_QUANTILE = 1.96  # two-sided 95%: the t quantile's limit with many degrees of freedom

# The between-run standard deviation of a speedup's log on this project's 2-core CPU machine
# (benchmarks/results/run_to_run.json, ``between_run_sd``, rounded up; --run-drift sets another).
RUN_DRIFT_SD = 0.06

# Two-sided 95% Student-t quantiles by degrees of freedom (beyond the table: 30 dof, a bit wide).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def _rounded(value: float) -> float:
    """Four decimals, as the records show ratios; a positive value too small for them keeps
    four significant digits (two rounds far apart put an interval's low end near 0, and a
    record read back must still hold 0 < low)."""
    rounded = round(value, 4)
    return rounded if rounded or not value else float(f"{value:.4g}")


@dataclass(frozen=True)
class SpeedupEstimate:
    """``ratio`` = float32's step time / this config's (above 1: faster), with its interval."""

    ratio: float
    low: float
    high: float
    rounds: int
    confidence: float = CONFIDENCE
    # The run-to-run allowance this interval includes (``across_runs``; 0: the rounds' alone),
    # and then the rounds' own interval.
    run_drift: float = 0.0
    rounds_low: float | None = None
    rounds_high: float | None = None

    def __post_init__(self) -> None:
        if not (0 < self.low <= self.ratio <= self.high):
            raise ValueError(f"a speedup interval must hold its estimate: expected 0 < low <= "
                             f"ratio <= high. Received: low={self.low}, ratio={self.ratio}, "
                             f"high={self.high}")

    @property
    def relative_half_width(self) -> float:
        """Half the interval's width as a share of the estimate (0.05: +-5%)."""
        return (self.high - self.low) / 2.0 / self.ratio

    def clears(self, threshold: float) -> bool:
        """True when even the interval's lower end is above ``threshold``."""
        return self.low > threshold

    def overlaps(self, other: "SpeedupEstimate") -> bool:
        return self.low <= other.high and other.low <= self.high

    def describe(self) -> str:
        return f"{self.ratio:.2f}x [{self.low:.2f}-{self.high:.2f}]"

    @property
    def rounds_interval(self) -> tuple[float, float]:
        """The interval from this run's timings alone (the allowance's, when widened, left out)."""
        if self.run_drift and self.rounds_low is not None and self.rounds_high is not None:
            return self.rounds_low, self.rounds_high
        return self.low, self.high

    def describe_allowance(self) -> str:
        """What the interval holds besides the rounds ("" when nothing)."""
        if not self.run_drift:
            return ""
        low, high = self.rounds_interval
        return (f"this run's rounds alone: {low:.2f}-{high:.2f}; "
                f"widened for run-to-run drift (sd {self.run_drift:.0%})")

    def across_runs(self, sd: float) -> "SpeedupEstimate":
        """This estimate's interval widened for the level's move between runs: ``sd`` (the
        between-run standard deviation of the log speedup) added in quadrature to each side's
        half-width in logs. float32 against itself (an identity) stays exact."""
        if sd <= 0 or self.run_drift or (self.low == self.ratio == self.high):
            return self
        centre = math.log(self.ratio)
        extra = (NORMAL_QUANTILE * sd) ** 2

        def widened(end: float) -> float:
            if not 0 < end < math.inf:
                return end
            return math.exp(centre + math.copysign(math.sqrt((math.log(end) - centre) ** 2
                                                             + extra), math.log(end) - centre))

        low, high = widened(self.low), widened(self.high)
        return SpeedupEstimate(self.ratio, min(low, self.ratio), max(high, self.ratio),
                               self.rounds, self.confidence, sd, self.low, self.high)

    def to_dict(self) -> dict:
        data = {"ratio": _rounded(self.ratio), "low": _rounded(self.low),
                "high": _rounded(self.high), "rounds": self.rounds,
                "confidence": self.confidence}
        if self.run_drift:
            data.update(run_drift=self.run_drift, rounds_low=_rounded(self.rounds_low),
                        rounds_high=_rounded(self.rounds_high))
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "SpeedupEstimate":
        return cls(float(data["ratio"]), float(data["low"]), float(data["high"]),
                   int(data["rounds"]), float(data.get("confidence", CONFIDENCE)),
                   float(data.get("run_drift", 0.0)), data.get("rounds_low"),
                   data.get("rounds_high"))

    @classmethod
    def identity(cls, rounds: int = 0) -> "SpeedupEstimate":
        """float32 against itself, by definition."""
        return cls(1.0, 1.0, 1.0, rounds)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


# How far one config's search-phase median drifts from run to run: float32 timed against itself
# measured 0.965-1.133 on this project's 2-core machine. Search-phase medians closer than this
# cannot be told apart (one run each).
SEARCH_DRIFT = 1.15


def median_interval(samples: Sequence[float], z: float = NORMAL_QUANTILE) -> tuple[float, float]:
    """A distribution-free ~95% interval for the median of ``samples``: the order statistics
    ranked n/2 -+ z*sqrt(n)/2 (the binomial's normal approximation)."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        raise ValueError("no samples")
    half = z * math.sqrt(n) / 2.0
    low = max(0, math.floor(n / 2.0 - half))
    high = min(n - 1, math.ceil(n / 2.0 + half) - 1)
    return ordered[low], ordered[max(low, high)]


def t_quantile(dof: int) -> float:
    """The two-sided 95% Student-t quantile for ``dof`` degrees of freedom."""
    if dof < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom. Received: dof={dof}")
    return _T95[min(dof, len(_T95)) - 1]


def round_log_ratios(baseline_rounds: Sequence[Sequence[float]],
                     candidate_rounds: Sequence[Sequence[float]]) -> list[float]:
    """``log(float32 median / candidate median)`` per round where both sides have timed steps.

    ``baseline_rounds[i]`` and ``candidate_rounds[i]`` are the timed steps (ms) of round ``i``.
    """
    return [math.log(median(base) / median(cand))
            for base, cand in zip(baseline_rounds, candidate_rounds) if len(base) and len(cand)]


@dataclass(frozen=True)
class PooledNoise:
    """The round-to-round variance of log ratios, pooled over several candidates."""

    variance: float
    dof: int

    @classmethod
    def of(cls, ratio_lists: Sequence[Sequence[float]]) -> "PooledNoise | None":
        squares, dof = 0.0, 0
        for ratios in ratio_lists:
            if len(ratios) >= 2:
                centre = sum(ratios) / len(ratios)
                squares += sum((r - centre) ** 2 for r in ratios)
                dof += len(ratios) - 1
        return cls(squares / dof, dof) if dof else None


def _spread(log_ratios: Sequence[float],
            pooled: PooledNoise | None) -> tuple[float, float, int] | None:
    """(mean log ratio, the variance an interval uses, its degrees of freedom): the wider of
    the candidate's own round-to-round spread and the pooled one; None when neither is known."""
    rounds = len(log_ratios)
    centre = sum(log_ratios) / rounds
    candidates = []
    if rounds >= 2:
        own = sum((r - centre) ** 2 for r in log_ratios) / (rounds - 1)
        candidates.append((own, rounds - 1))
    if pooled is not None:
        candidates.append((pooled.variance, pooled.dof))
    if not candidates:
        return None
    variance, dof = max(candidates)   # the wider spread (and its own degrees of freedom)
    return centre, variance, dof


def speedup_from_log_ratios(log_ratios: Sequence[float], pooled: PooledNoise | None = None,
                            confidence: float = CONFIDENCE) -> SpeedupEstimate:
    """Geometric-mean speedup with a t interval (see the module docstring)."""
    if confidence != CONFIDENCE:
        raise ValueError(f"only {CONFIDENCE:.0%} intervals are supported. Received: "
                         f"confidence={confidence}")
    rounds = len(log_ratios)
    if rounds == 0:
        raise ValueError("a speedup needs at least one round with timed steps on both sides")
    spread = _spread(log_ratios, pooled)
    if spread is None:  # one round and nothing to pool: the noise is unknown, so is the bound
        return SpeedupEstimate(math.exp(sum(log_ratios) / rounds), _UNKNOWN_LOW, math.inf,
                               rounds, confidence)
    centre, variance, dof = spread
    half = t_quantile(dof) * math.sqrt(variance / rounds)
    return SpeedupEstimate(math.exp(centre), math.exp(centre - half), math.exp(centre + half),
                           rounds, confidence)


def projected_speedup(log_ratios: Sequence[float], pooled: PooledNoise | None,
                      rounds: int) -> SpeedupEstimate | None:
    """The interval ``rounds`` rounds would give if the estimate stayed where it is and the
    spread stayed as measured, with the normal quantile (below every t quantile): the
    narrowest that many rounds could plausibly make it. None when the spread is unknown."""
    spread = _spread(log_ratios, pooled) if log_ratios else None
    if spread is None:
        return None
    centre, variance, _ = spread
    half = NORMAL_QUANTILE * math.sqrt(variance / max(rounds, len(log_ratios)))
    return SpeedupEstimate(math.exp(centre), math.exp(centre - half), math.exp(centre + half),
                           rounds)


def paired_speedup(baseline_rounds: Sequence[Sequence[float]],
                   candidate_rounds: Sequence[Sequence[float]],
                   pooled: PooledNoise | None = None) -> SpeedupEstimate:
    """The speedup of a candidate over float32 from paired rounds of step times (ms)."""
    return speedup_from_log_ratios(round_log_ratios(baseline_rounds, candidate_rounds), pooled)
