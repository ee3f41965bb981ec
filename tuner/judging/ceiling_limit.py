"""Which 16-bit dtypes the device's ceiling says cannot win at this model's scale.

A model trains no faster in a dtype than the device's arithmetic in that dtype at the model's
own products allows: on this project's machines whole models gained 45-65% of the ceiling at a
large matrix product (docs/concepts/ceiling.md). So where even the top of a dtype's ceiling at
the model's largest layer (``tuner.worker.device.ceiling``: its ``model`` figure; the device's
peak where the model has no dense-like kernel) lies below float32 + ``min_gain`` (the least
gain a pick must clear, ``tuner.judging.decision``), no config computing in it can be the
speed objective's pick, and training its trials only spends the user's time: they are left out
(``tuner.run.plan.RunPlan.within_ceiling``), and where that leaves no 16-bit policy, float32 is
the answer once the baseline has trained. ``--keep-slow-policies`` tries them anyway; the
memory and balanced objectives never leave one out (a slow dtype still halves memory).

The top of a figure's interval: the figure times its top noise, its own (``spread``, the 95%
half-width in logs of its paired turns) and its move between runs (``CEILING_RUN_DRIFT``, the
standard deviation of the figure's log from run to run) added in quadrature. A figure within
that noise of float32 + ``min_gain`` stays in: borderline dtypes get their trials.

Pure Python: the ceiling's plain dict in, plain data out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tuner.judging.noise import NORMAL_QUANTILE

# The standard deviation of a ceiling figure's log from run to run: the model's figure for
# digits' largest layer read bfloat16 1.56-1.75x in ten runs on the 2-core EPYC (sd ~0.04 in
# logs), the peak 2.4-2.7x in turns (~0.04); rounded up.
CEILING_RUN_DRIFT = 0.05


@dataclass(frozen=True)
class DtypeCeiling:
    """One 16-bit dtype's ceiling at the scale that limits this model."""

    dtype: str
    speed: float         # float32's step time over the dtype's there (above 1: faster)
    top: float           # the top of its interval (``speed`` times its noise)
    where: str           # the scale, in the model's terms

    def cannot_win(self, min_gain: float) -> bool:
        """True when even the top of the interval is below float32 + ``min_gain``."""
        return self.top < 1.0 + min_gain

    def describe(self) -> str:
        return f"{self.speed:.2g}x {self.where} (at most {self.top:.2g}x with its noise)"


def dtype_ceilings(ceiling: dict[str, Any] | None) -> dict[str, DtypeCeiling]:
    """Each 16-bit dtype's ceiling at the model's largest layer, or at the device's peak where
    the ceiling has no model figure for it; empty without a ceiling. A dtype timed at neither
    (emulated: the small step only) is read at the small step."""
    if not ceiling:
        return {}
    model, peak = ceiling.get("model") or {}, ceiling.get("peak") or {}
    found = {}
    for dtype, small in ceiling.get("speed", {}).items():
        if dtype == "float32":
            continue
        if dtype in model.get("speed", {}):
            batch, width_in, width_out = model["shape"]
            figure, where = model, (f"at your largest layer ({model['layer']}, "
                                    f"{width_in}x{width_out}, batch {batch})")
        elif dtype in peak.get("speed", {}):
            figure, where = peak, f"at the device's peak (a {peak['size']}-wide layer)"
        else:
            figure, where = ceiling, f"at a {ceiling.get('size', '?')}-wide layer"
        speed = float(figure["speed"][dtype])
        spread = float((figure.get("spread") or {}).get(dtype, 0.0))
        noise = math.hypot(spread, NORMAL_QUANTILE * CEILING_RUN_DRIFT)
        found[dtype] = DtypeCeiling(dtype, speed, speed * math.exp(noise), where)
    return found


def ruled_out(ceiling: dict[str, Any] | None, min_gain: float) -> dict[str, DtypeCeiling]:
    """The 16-bit dtypes that cannot win at this model's scale (``DtypeCeiling.cannot_win``)."""
    return {dtype: found for dtype, found in dtype_ceilings(ceiling).items()
            if found.cannot_win(min_gain)}


def no_fast_16bit(ceiling: dict[str, Any], slow: dict[str, DtypeCeiling]) -> str:
    """The reason float32 is the answer, in the model's terms: "this CPU has no fast bfloat16
    or float16: bfloat16 0.83x at your largest layer (...)..."."""
    device = "this CPU" if ceiling.get("device", "CPU") == "CPU" else ceiling["device"]
    names = " or ".join(slow)
    figures = "; ".join(f"{found.dtype} {found.describe()}" for found in slow.values())
    return f"{device} has no fast {names}: {figures}"


def memory_still_bought(training_memory: dict[str, Any] | None) -> str:
    """What 16-bit would still save where it cannot win on speed, from the float32 baseline's
    training memory (``tuner.worker.trial.memory.training_memory``, the memory objective's
    figure): a mixed policy's activations in 16 bits halve them, a pure 16-bit policy halves
    about everything. "" without the figure."""
    if not training_memory or not training_memory.get("total_bytes"):
        return ""
    total = training_memory["total_bytes"] / 1e6
    activations = sum((training_memory.get("activations") or {}).values()) / 1e6
    return (f"what 16-bit would still buy: memory, not speed. Training needs {total:.3g} MB in "
            f"float32 (measured on the baseline); a mixed 16-bit policy would save up to "
            f"{activations / 2:.3g} MB (half the activations), a pure one about "
            f"{total / 2:.3g} MB: --objective memory picks by it")
