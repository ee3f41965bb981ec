"""How many steps a trial runs: as many as its timing and its loss comparison need.

A fixed step count is wrong at both ends: 30 steps of a 2 ms model time 60 ms of work, one
burst of the machine's noise, and barely move its loss; 30 steps of a 2 s model spend a minute
per trial. So, unless ``--steps`` fixes the count, the float32 baseline trial is *sized*: after
the space's ``steps`` (the floor) it keeps training until

- its median step time is known to ``timing_precision`` (the distribution-free 95% interval of
  the median, ``tuner.judging.noise.median_interval``, as a share of the median) over at least
  ``min_timed_s`` of timed steps (this machine's noise comes in bursts of a few hundred
  milliseconds: a shorter run is timed inside one of them), and
- its loss decrease is large enough for the verdict to resolve a shortfall: a trial reaching
  twice the tolerated shortfall (80% of float32's decrease at ``--tolerance 0.9``) must differ
  from float32 by more than the verdict's noise margin (``tuner.judging.verdict``);

or until it has trained ``cap_s`` seconds (never fewer than ``min_steps``) or ``max_steps``
steps. Every later trial, and each re-measurement run, trains the baseline's count: the verdict
compares trial and baseline over the same steps on the same batches. Pure arithmetic on plain
lists: the worker asks ``enough`` after each step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tuner.judging.noise import median_interval
from tuner.judging.verdict import NOISE_SIGMAS, decrease_noise, loss_decrease

TIMING_PRECISION = 0.02     # the median step time to +-2%
MIN_TIMED_S = 1.0           # timed steps must span at least this long
DEFAULT_CAP_S = 2.5         # the baseline's training (after its first, tracing step) at most
MAX_STEPS = 2000
BATCH_POOL = 50             # distinct batches a sized run cycles through (data materialised once)


@dataclass(frozen=True)
class Sizing:
    """The rule a sized baseline trial stops by (plain data: it travels in the TrialSpec)."""

    floor: int                  # never stop before this many steps (the space's ``steps``) ...
    min_steps: int              # ... unless the cap is reached; never before this many
    cap_s: float = DEFAULT_CAP_S
    max_steps: int = MAX_STEPS
    tolerance: float = 0.9
    timing_precision: float = TIMING_PRECISION
    min_timed_s: float = MIN_TIMED_S

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sizing":
        return cls(**data)


def timing_spread(timed_ms: list[float]) -> float | None:
    """Half the width of the median's 95% interval, as a share of the median."""
    if len(timed_ms) < 2:
        return None
    low, high = median_interval(timed_ms)
    middle = sorted(timed_ms)[len(timed_ms) // 2]
    return (high - low) / (2.0 * middle) if middle > 0 else None


def loss_resolution(losses: list[float], tolerance: float) -> float | None:
    """How far the loss decrease is from resolving the verdict's question (>= 1.0: it is).

    The verdict calls a trial unstable when it falls short of ``tolerance`` of float32's
    decrease by more than ``NOISE_SIGMAS`` standard errors. A shortfall of twice the tolerated
    one, ``2 * (1 - tolerance) * decrease``, must exceed that margin."""
    decrease = loss_decrease(losses)
    if decrease is None or decrease <= 0:
        return None
    noise = decrease_noise(losses)
    if noise <= 0:
        return float("inf")
    return 2.0 * (1.0 - tolerance) * decrease / (NOISE_SIGMAS * noise)


def enough(losses: list[float], step_times_ms: list[float], warmup_steps: int,
           sizing: Sizing) -> str | None:
    """Why a sized run may stop after these steps, or None to go on.

    ``step_times_ms[0]`` is the tracing step: it counts for nothing."""
    steps = len(losses)
    trained_s = sum(step_times_ms[1:]) / 1000.0
    if steps >= sizing.max_steps:
        return f"the most steps a trial runs ({sizing.max_steps})"
    if steps >= sizing.min_steps and trained_s >= sizing.cap_s:
        return f"the time cap ({sizing.cap_s:g} s of training)"
    if steps < sizing.floor:
        return None
    timed = step_times_ms[warmup_steps:]
    timed_s = sum(timed) / 1000.0
    if timed_s < sizing.min_timed_s:
        return None
    spread = timing_spread(timed)
    if spread is None or spread > sizing.timing_precision:
        return None
    resolution = loss_resolution(losses, sizing.tolerance)
    if resolution is None or resolution < 1.0:
        return None
    return (f"its median step time known to +-{spread:.1%} over {timed_s:.1f} s "
            f"and its loss decrease {_times(resolution)} what the verdict needs")


def _times(factor: float) -> str:
    return "far beyond" if factor == float("inf") or factor > 100 else f"{factor:.1f}x"
