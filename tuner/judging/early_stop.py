"""When a run stops before its step count: the early stop that a worker asks after every step.

``should_stop`` reads a run's record after a step: a non-finite loss ends it (diverged); a run
clearly slower than the best stable one so far ends it (``too_slow_reason``: never on warm-up
steps, never on one hiccup); a sized run ends once ``tuner.judging.sizing.enough`` says its
timing and loss comparison are resolved; a time-bounded run once it has trained its time
(``time_bound_reached``). Each says why in the record. Pure arithmetic on the record's plain
lists: the worker's step timer (tuner.worker.trial.steps) and the tests' scripted executor ask
the same rules.
"""

from __future__ import annotations

import math
import statistics

from tuner.judging.sizing import Sizing, enough
from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec

# Early stopping (see too_slow_reason): warm-up steps never count; after warm-up, a trial is
# stopped when its last _HOPELESS_STEPS steps were all over _HOPELESS_FACTOR x the limit (float16
# on a CPU without it runs 10-100x slower) and so was its median timed step, or when, over at
# least _MIN_TIMED_STEPS_FOR_STOP (or half the timed budget), even its lower quartile is
# _CLEAR_MARGIN beyond the limit. One hiccup cannot do either, nor can a stall of a few steps in
# a run that was fast before it (the machine busy for a moment); a near-miss runs to the end and
# is judged like any other trial.
_HOPELESS_FACTOR = 3.0
_HOPELESS_STEPS = 3
_MIN_TIMED_STEPS_FOR_STOP = 6
_CLEAR_MARGIN = 1.1


def should_stop(result: TrialResult, spec: TrialSpec, sizing: Sizing | None, step: int,
                 loss: float, elapsed_ms: float) -> bool:
    """After a recorded step: stop on a non-finite loss, when clearly too slow, once a sized
    run has measured enough, or once a time-bounded run has trained its time (each says so in
    ``result``)."""
    if not math.isfinite(loss):
        result.first_non_finite_step = step
        result.outcome = TrialOutcome.DIVERGED
        return True
    reason = too_slow_reason(result, spec, step, elapsed_ms)
    if reason:
        result.outcome = TrialOutcome.STOPPED_SLOW
        result.stop_reason = reason
        return True
    if sizing is not None:
        result.sized_by = enough(result.losses, result.step_times_ms, spec.warmup_steps,
                                 sizing)
        return bool(result.sized_by)
    return time_bound_reached(result, spec)


def time_bound_reached(result: TrialResult, spec: TrialSpec) -> bool:
    """Whether a time-bounded run has trained its time (and its fewest steps) before its step
    count: then ``result`` says so (``time_bounded_s``) and the run stops."""
    if spec.time_bound_s is None or result.train_s < spec.time_bound_s \
            or not spec.time_bound_min_steps <= len(result.losses) < spec.steps:
        return False
    result.time_bounded_s = spec.time_bound_s
    return True


def too_slow_reason(result: TrialResult, spec: TrialSpec, step: int, elapsed_ms: float) -> str:
    """Why to stop this trial now as clearly slower than the best one so far ("" to go on)."""
    limit = spec.stop_if_slower_than_ms
    timed = result.timed_steps_ms  # empty during warm-up: tracing and first steps never count
    if limit is None or not timed:
        return ""
    recent = timed[-_HOPELESS_STEPS:]
    hopeless = _HOPELESS_FACTOR * limit
    if len(recent) == _HOPELESS_STEPS and min(recent) > hopeless:
        median = statistics.median(timed)   # over it too: slow throughout, not a stall
        if median > hopeless:
            return (f"stopped at step {step}: the last {_HOPELESS_STEPS} steps all took over "
                    f"{_HOPELESS_FACTOR:g}x the limit of {limit:.1f} ms (fastest "
                    f"{min(recent):.1f} ms), and so did its median timed step "
                    f"({median:.1f} ms)")
    needed = max(_MIN_TIMED_STEPS_FOR_STOP, (spec.steps - spec.warmup_steps) // 2)
    if len(timed) < needed:
        return ""
    quartile = sorted(timed)[len(timed) // 4]
    if quartile > _CLEAR_MARGIN * limit:
        return (f"stopped after {step + 1} steps: even the fastest quarter of its steps took "
                f"over {quartile:.1f} ms, beyond the early-stop limit of {limit:.1f} ms "
                f"(+{_CLEAR_MARGIN - 1:.0%} margin; median {statistics.median(timed):.1f} ms)")
    return ""
