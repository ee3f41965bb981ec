"""Judging each loss of a model that returns several (a GAN's ``d_loss`` and ``g_loss``), each
against float32's run of the same loss, with the same seed, batches and steps. Pure Python.

A GAN's losses do not fall: the discriminator and the generator pull against each other, and
float32's ``g_loss`` often rises while its images improve. So a loss is judged on what
float32's run of it does:

- a loss that float32 brought down beyond its noise must come down as well, to (almost)
  float32's level (within the noise and the level allowance). Not by the ratio of the two
  decreases, as a single loss is: over a trial's few steps a GAN's losses wander as much as
  they fall, and a ratio of two wanderings rejected a sound mixed_bfloat16 config of the
  example DCGAN (85% of float32's g_loss decrease, ending at its level);
- any other loss (adversarial: it oscillates, or float32's rises) must stay in float32's band:
  its end level inside the range float32's loss spanned over the last half of its run, widened
  by the noise and the level allowance ("slack"); and over that last half it must not move
  away from float32's end level by more than float32 itself moved, plus float32's range and
  half the slack (its trend: on its way out of the band, not there yet). A discriminator whose loss
  goes to zero (it wins: the generator learns nothing) or a generator loss that runs off leaves
  the band; the oscillation float32 shows itself does not.
"""

from __future__ import annotations

import math
import statistics

from tuner.judging.learning import (
    LEVEL_ALLOWANCE,
    NOISE_SIGMAS,
    _window,
    decrease_noise,
    level_gap,
    loss_decrease,
    standard_error,
)


def terms_gap(mine: dict[str, list[float]], base: dict[str, list[float]]) -> str:
    """Why one of ``mine``'s losses fell short of float32's ``base`` ("" when none did)."""
    for name, reference in base.items():
        own = mine.get(name)
        if not own:
            return f"{name} was not returned by the train_step, while float32's was"
        gap = term_gap(name, own, reference)
        if gap:
            return gap
    return ""


def term_gap(name: str, own: list[float], reference: list[float]) -> str:
    """Why the loss ``name`` of a trial (``own``) fell short of float32's (``reference``)."""
    if not all(map(math.isfinite, own)):
        step = next(i for i, v in enumerate(own) if not math.isfinite(v))
        return f"{name} non-finite at step {step}"
    drop = loss_decrease(reference)
    if drop is None or loss_decrease(own) is None or not math.isfinite(drop):
        return f"{name}: too few finite values to compare with float32's"
    margin = NOISE_SIGMAS * decrease_noise(reference) + 1e-3 * abs(statistics.fmean(reference))
    window = _window(len(reference))
    if drop > margin:   # float32 brought it down: so must the trial, to (almost) its level
        return level_gap(f"{name} ended at", statistics.fmean(own[-window:]),
                         statistics.fmean(reference[-window:]), margin, LEVEL_ALLOWANCE)
    return band_gap(name, own, reference, margin)


def band_gap(name: str, own: list[float], reference: list[float], noise: float) -> str:
    """Why the adversarial loss ``name`` left float32's band, or drifted off it ("")."""
    window = _window(len(reference))
    half = len(reference) // 2
    means = [statistics.fmean(reference[i:i + window])
             for i in range(half, len(reference) - window + 1)] or \
        [statistics.fmean(reference[-window:])]
    low, high = min(means), max(means)
    end_ref = statistics.fmean(reference[-window:])
    slack = max(noise, LEVEL_ALLOWANCE * max(abs(end_ref), high - low))
    end = statistics.fmean(own[-window:])
    if end < low - slack or end > high + slack:
        return (f"{name} ended at {end:.3g}, outside float32's band {low:.3g} to {high:.3g} "
                f"over the last half of its run (+-{slack:.2g})")
    middle = min(half, len(own) - window)
    if middle < 0 or len(own) < 2 * window:
        return ""
    drift = end - statistics.fmean(own[middle:middle + window])
    drift_ref = end_ref - statistics.fmean(reference[half:half + window])
    away = abs(end + drift - end_ref) > abs(end - end_ref)   # moving away from float32's end
    if away and abs(drift - drift_ref) > slack / 2 + (high - low):
        return (f"{name} drifted by {drift:+.3g} over the last half of its run, float32's by "
                f"{drift_ref:+.3g} (band {low:.3g} to {high:.3g}, +-{slack:.2g})")
    return ""


def stretch_terms_gap(first: dict[str, list[float]], last: dict[str, list[float]],
                      pick: dict[str, list[float]]) -> str:
    """Why the pick's losses over the confirmation's last stretch fell short of float32's
    (``last``) ("" when none did). A loss float32 brought down since the first stretch
    (``first``) beyond its noise must end at (almost) float32's level; any other must stay in
    float32's band over the stretch (``band_gap``)."""
    for name, reference in last.items():
        own = pick.get(name)
        if not own or not reference:
            return f"{name} was not returned by the pick's train_step over the last stretch"
        noise = NOISE_SIGMAS * standard_error(reference)
        end = statistics.fmean(reference)
        start = statistics.fmean(first.get(name) or reference)
        if start - end > noise:
            gap = level_gap(f"{name} over the last stretch", statistics.fmean(own), end, noise,
                            LEVEL_ALLOWANCE)
        else:
            gap = band_gap(name, own, reference, noise)
        if gap:
            return gap
    return ""
