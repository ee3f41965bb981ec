"""Is a trial stable, compared with the float32 baseline? Pure Python, no TensorFlow.

Stable iff: every loss finite; the loss scale did not collapse; skipped steps within a
bound; the trial learned (almost) as much as the float32 baseline did with the same seed, data
and step budget, *and ended at (almost) its level*: a large first drop (learning the mean, the
bias) cannot hide a plateau above float32's; and it validates (almost) as well as float32 on the
same validation batches (``validation_gap``).

"As much" is judged against the losses' own step-to-step noise. Trial and baseline see the
same batches in the same order, so their noise comes mostly from the batches; the baseline's
batch-to-batch scatter gives the standard error of a start-or-end window mean. When float32's
own decrease is within that noise (it barely learned in the budget), a ratio of two tiny
numbers means nothing: the trial then only has to end no worse than float32, and the
judgement says so in its ``note``.
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass, replace

from tuner.apply.vocabulary import LossScaleKind
from tuner.judging.learning import (  # noqa: F401 - also this module's public names
    LEVEL_ALLOWANCE,
    NOISE_SIGMAS,
    _window,
    barely_learned,
    decrease_noise,
    level_gap,
    loss_decrease,
    standard_error,
)
from tuner.judging.terms import terms_gap
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
    note: str = ""                    # context a reader needs (e.g. float32 barely learned)
    shortfall: bool = False           # unstable for learning less or ending worse than float32
    # A time-bounded trial (``TrialResult.time_bounded_s``): the steps it was judged on,
    # against float32's first as many; None when judged on the full count.
    judged_steps: int | None = None

    @property
    def stable(self) -> bool:
        return self.verdict is Verdict.STABLE


# A dynamic loss scale has collapsed when non-finite gradients persist at the lowest scale it
# reached: its last COLLAPSE_TAIL steps were all skipped (it was still halving, or sat at its
# floor skipping). Judged on the trend, not on a level: a scale that starts at 2^15 and backs
# off to a steady 2^9 is working as designed, and one that starts near the floor is not
# "collapsed" by one overflow.
COLLAPSE_TAIL = 5


def loss_scale_collapse(result: TrialResult, floor: float) -> str:
    """Why the trial's dynamic loss scale collapsed ("" when it did not)."""
    scales = [s for s in result.loss_scales if s is not None]
    steps = len(result.losses)
    if not LossScaleKind(result.loss_scale_kind).moves or not scales or steps < COLLAPSE_TAIL:
        return ""
    if not set(range(steps - COLLAPSE_TAIL, steps)) <= set(result.skipped):
        return ""
    low = min(scales)
    start = result.initial_loss_scale or scales[0]
    where = f"its floor ({floor:g})" if low <= floor else f"{low:g}"
    return (f"the loss scale collapsed: non-finite gradients at every scale it tried, from "
            f"{start:g} down to {where}; the last {COLLAPSE_TAIL} steps were all skipped "
            f"({result.skipped_steps} of {steps} in all)")


def settled_skips(result: TrialResult, floor: float = 0.0) -> int:
    """Skipped steps after a dynamic scale's first back-off: a scale that starts too high
    (Keras's 2^15) halves, skipping a step each time, until the gradients fit; that is the
    mechanism working, not a cost of the config's stability. A fixed scale never backs off.
    A back-off that only ended at the ``floor`` is not counted as one: the floor is where a
    scale counts as collapsed, and a critic whose scale halved from 2^15 to 1 had its update
    skipped in 15 of 16 steps (a WGAN-GP trial): every one of those skips counts."""
    if not LossScaleKind(result.loss_scale_kind).moves:
        return result.skipped_steps
    leading = 0
    while leading in result.skipped:
        leading += 1
    scales = result.loss_scales
    if leading and leading <= len(scales) and scales[leading - 1] is not None \
            and scales[leading - 1] <= floor:
        return result.skipped_steps
    return sum(1 for step in result.skipped if step >= leading) \
        if result.skipped else result.skipped_steps


def judge(result: TrialResult, baseline: TrialResult | None, *, floor: float,
          max_skipped_fraction: float, min_loss_decrease_ratio: float,
          expected_steps: int) -> Judgement:
    if result.time_bounded_s is not None and baseline is not None and baseline is not result:
        return _judge_bounded(result, baseline, floor=floor,
                              max_skipped_fraction=max_skipped_fraction,
                              min_loss_decrease_ratio=min_loss_decrease_ratio)
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
            if result.failure_layer else " (every layer's output was finite: it arose in the " \
            "train_step's own ops, its gradients or its updates)" if result.loss_terms else \
            " (the forward pass is finite: gradients or updates overflowed)"
        which = next((name for name, values in result.loss_terms.items()
                      if len(values) > step and not math.isfinite(values[step])), "loss")
        return Judgement(Verdict.UNSTABLE, f"{which} non-finite at step {step}{where}", None,
                         median)
    collapse = any_collapse(result, floor)
    if collapse:
        return Judgement(Verdict.UNSTABLE, collapse, None, median)
    skipping = skip_failure(result, floor, max_skipped_fraction, expected_steps)
    if skipping:
        return Judgement(Verdict.UNSTABLE, skipping, None, median)
    if baseline is None or baseline is result:
        return _judge_baseline(result, median)
    if baseline.loss_terms:   # several losses (a GAN's): each judged against float32's
        shortfall = terms_gap(result.loss_terms, baseline.loss_terms)
        judgement = Judgement(Verdict.UNSTABLE if shortfall else Verdict.STABLE, shortfall,
                              None, median, shortfall=bool(shortfall))
    else:
        judgement = _compare_learning(result, baseline, min_loss_decrease_ratio, median)
    if not judgement.stable:
        return judgement
    gap = validation_failure(result.validation, baseline.validation) or \
        validation_gap(result.validation, baseline.validation) or \
        metric_gap(result.validation, baseline.validation)
    if gap:
        return Judgement(Verdict.UNSTABLE, gap, judgement.loss_decrease_ratio, median,
                         judgement.note, shortfall=True)
    return judgement


def _judge_bounded(result: TrialResult, baseline: TrialResult, **rules) -> Judgement:
    """A trial stopped at its time bound, judged on the steps it trained against float32's
    first as many (the same batches in the same order), every rule scaled to that count. Its
    validation is not compared: float32 validated after all its steps, and a model that
    trained fewer would read as worse for that alone (the confirmation validates a pick over
    a longer run)."""
    steps = len(result.losses)
    first = replace(baseline, losses=baseline.losses[:steps], validation=None,
                    loss_terms={name: values[:steps]
                                for name, values in baseline.loss_terms.items()})
    judgement = judge(replace(result, time_bounded_s=None), first, expected_steps=steps,
                      **rules)
    if judgement.stable:   # the table and the summary say on how many steps
        return replace(judgement, judged_steps=steps)
    why = (f"judged on its first {steps} steps against float32's first {steps}: it trained "
           f"for its time bound ({result.time_bounded_s:.3g} s) instead of "
           f"{len(baseline.losses)} steps; validation not compared")
    return replace(judgement, reason=f"{judgement.reason} ({why})", judged_steps=steps)


def any_collapse(result: TrialResult, floor: float) -> str:
    """Why a loss scale collapsed: of one of several optimizers (named; each keeps its own
    scale), or of the only one ("" when none did)."""
    for record, own in zip(result.optimizers, _each_optimizer(result)):
        collapse = loss_scale_collapse(own, floor)
        if collapse:
            return f"{record['name']}: {collapse}"
    return loss_scale_collapse(result, floor)


def skip_failure(result: TrialResult, floor: float, max_fraction: float,
                 expected_steps: int) -> str:
    """Why too many steps were skipped ("" when not): counted per optimizer, each after its
    scale's first back-off (``settled_skips``), the one named where there are several."""
    names = [record["name"] + ": " for record in result.optimizers] or [""]
    for name, own in zip(names, _each_optimizer(result)):
        skips = settled_skips(own, floor)
        if skips > max_fraction * expected_steps:
            settled = "" if skips == own.skipped_steps else " after the scale's first back-off"
            scale = next((s for s in reversed(own.loss_scales) if s is not None), None)
            at = f" at scale {scale:g}" if scale is not None else ""
            return (f"{name}skipped {skips} of {len(result.losses)} steps{settled} (non-finite "
                    f"gradients{at}); at most {max_fraction:.0%} allowed")
    return ""


def _each_optimizer(result: TrialResult) -> list[TrialResult]:
    """The trial as each of its optimizers saw it (its own scales and skipped steps), or the
    trial itself where it has one optimizer."""
    return [replace(result, loss_scales=record["loss_scales"], skipped=record["skipped"],
                    skipped_steps=len(record["skipped"]),
                    initial_loss_scale=record["initial_loss_scale"])
            for record in result.optimizers] or [result]


def metric_gap(mine: dict | None, base: dict | None) -> str:
    """Why the task's ``val_metric(model)`` (lower is better) came out worse than float32's
    beyond its noise and the level allowance, or failed where float32's ran ("" otherwise).
    The noise is float32's batch-to-batch scatter where the metric gives one value per batch
    of samples (``val_metric_values``); a single number has only the allowance."""
    reference = (base or {}).get("val_metric")
    if reference is None or not math.isfinite(reference):
        return ""
    own = (mine or {}).get("val_metric")
    if own is None:
        why = (mine or {}).get("val_metric_error") or "no value"
        return f"val_metric failed where float32's ran: {why}"
    if not math.isfinite(own):
        return f"val_metric non-finite (float32's {reference:.3g})"
    noise = NOISE_SIGMAS * standard_error((base or {}).get("val_metric_values") or [])
    return level_gap("val_metric", own, reference, noise, LEVEL_ALLOWANCE)


def validation_failure(mine: dict | None, base: dict | None) -> str:
    """Why this run's validation failed where float32's ran ("" when it ran, or when float32's
    failed as well: then no config can be compared on validation, every trial is judged on its
    training losses, and the summary says why). A model that evaluates in float32 and raises,
    or reports no loss, under a 16-bit config has failed a check, not skipped one."""
    if not base or "loss" not in base or (mine and "loss" in mine):
        return ""
    error = (mine or {}).get("error") or "no validation result"
    return f"validation failed where float32's ran: {error}"


def validation_gap(mine: dict | None, base: dict | None,
                   allowance: float = LEVEL_ALLOWANCE) -> str:
    """Why ``mine`` validates worse than float32's ``base`` beyond noise and ``allowance``
    ("" when it does not, or when either could not be evaluated). Both are
    ``tuner.worker.trial.validation`` results on the same batches; the noise is float32's
    batch-to-batch scatter (the standard error of its mean over the batches)."""
    if not mine or not base or "loss" not in mine or "loss" not in base:
        return ""
    own, reference = mine["loss"], base["loss"]
    if not math.isfinite(reference):
        return ""
    if not math.isfinite(own):
        return f"validation loss non-finite (float32's {reference:.3g})"
    noise = NOISE_SIGMAS * standard_error(base.get("batch_losses") or [])
    return level_gap("validation loss", own, reference, noise, allowance)


def _judge_baseline(result: TrialResult, median: float | None) -> Judgement:
    if result.loss_terms:   # several losses: their sum's decrease means nothing (a GAN's)
        return Judgement(Verdict.STABLE, "", 1.0, median)
    base, noise = loss_decrease(result.losses), decrease_noise(result.losses)
    if base is None or base <= NOISE_SIGMAS * noise:
        return Judgement(Verdict.STABLE, "", 1.0, median, barely_learned(base, noise,
                                                                          len(result.losses)))
    return Judgement(Verdict.STABLE, "", 1.0, median)


def _compare_learning(result: TrialResult, baseline: TrialResult, tolerance: float,
                      median: float | None) -> Judgement:
    base, mine = loss_decrease(baseline.losses), loss_decrease(result.losses)
    if base is None or mine is None or not math.isfinite(base):
        return Judgement(Verdict.UNSTABLE, "cannot compare with the float32 baseline (too few "
                         "finite losses)", None, median)
    noise = decrease_noise(baseline.losses)
    # Plus a relative sliver, so that identical noiseless curves compare equal at any scale.
    margin = NOISE_SIGMAS * noise + 1e-3 * abs(statistics.fmean(baseline.losses))
    if base <= NOISE_SIGMAS * noise:
        # Same batches, same order: compare where the two runs end, against the noise.
        window = _window(len(baseline.losses))
        gap = statistics.fmean(result.losses[-window:]) - \
            statistics.fmean(baseline.losses[-window:])
        note = barely_learned(base, noise, len(baseline.losses))
        if gap > margin:
            return Judgement(Verdict.UNSTABLE, f"ended at a loss {gap:.3g} above float32's "
                             f"(beyond its noise of {margin:.2g}); {note}", None, median, note,
                             shortfall=True)
        return Judgement(Verdict.STABLE, "", None, median, note)
    ratio = mine / base
    if ratio < tolerance and base - mine > margin:
        return Judgement(Verdict.UNSTABLE, f"reached {ratio:.0%} of float32's loss decrease "
                         f"(needs {tolerance:.0%})", ratio, median, shortfall=True)
    window = _window(len(baseline.losses))
    level = level_gap("ended at a training loss", statistics.fmean(result.losses[-window:]),
                       statistics.fmean(baseline.losses[-window:]), margin, LEVEL_ALLOWANCE)
    if level:
        return Judgement(Verdict.UNSTABLE, f"{level}, although it reached {ratio:.0%} of "
                         "float32's loss decrease", ratio, median, shortfall=True)
    return Judgement(Verdict.STABLE, "", ratio, median)
