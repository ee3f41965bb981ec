"""A continuous input feature that a 16-bit cast erases, as evidence: which is worst, in words.

The worker's input check (tuner.worker.diagnostics.continuous_inputs) finds, per layer, the
features that a cast to a 16-bit dtype erases (an ``erasure`` entry: the feature's range and
spread, and per dtype the rounding noise, the step at its typical magnitude and the distinct
values that survive). ``severity`` orders them worst first; ``values_text`` and ``step_text``
say a feature's values and a dtype's step there the same way wherever it is said: in a trial's
failure reason (in the worker) and in the diagnostics' records
(tuner.records.diagnostics_report). Pure text and arithmetic on plain data.
"""

from __future__ import annotations

import math
from typing import Any

from tuner.judging.layer_risk import FLOAT16_MAX


def _number(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def values_text(entry: dict[str, Any]) -> str:
    """``values -122.5..-121.8, spread 0.20``: the range to as many decimals as the spread
    needs for two significant digits (a timestamp's range in %g would read 1.7e+09..1.7e+09);
    values all below 0.001 in %g (``values -3e-21..2.5e-21, spread 1e-21``), not in decimals."""
    if max(abs(entry["min"]), abs(entry["max"])) < 1e-3:
        return f"values {entry['min']:.2g}..{entry['max']:.2g}, spread {entry['spread']:.2g}"
    decimals = max(0, 1 - math.floor(math.log10(entry["spread"])))
    return (f"values {_number(entry['min'], decimals)}..{_number(entry['max'], decimals)}, "
            f"spread {entry['spread']:.{decimals}f}")


def step_text(entry: dict[str, Any], dtype: str) -> str:
    """``step there is 0.5`` (or ``overflows there``, float16 beyond 65504)."""
    step = entry["step"][dtype]
    return f"overflows there (beyond {FLOAT16_MAX:g})" if step is None \
        else f"step there is {step:g}"


def severity(entry: dict[str, Any]) -> tuple[int, float]:
    """Sort key of continuous features, worst first: erased in more dtypes, then the most
    noise in any of them."""
    return -len(entry["erased_in"]), -max(entry["noise"].values())
