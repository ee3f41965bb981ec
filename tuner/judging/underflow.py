"""Gradient underflow as evidence: the share of a layer's gradients that float16 flushes to
zero at a given loss scale, read from the diagnostics' histograms of binary exponents
(``log2_counts``: how many non-zero values have each exponent, from float32 steps).

Plain Python: the diagnostics are plain data by the time they reach the driver.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from tuner.apply.config import PrecisionConfig
from tuner.trial_types import TrialResult

FLOAT16_FLUSH_EXPONENT = -24   # float16's smallest subnormal is 2^-24
NOTABLE_FLUSH = 0.05           # a layer is named when at least 5% of its gradients flush
NAMED_LAYERS = 3


def flushed_fraction(stats: Mapping[str, Any], scale: float) -> float | None:
    """The share of a tensor's non-zero values that float16 flushes to zero once multiplied
    by ``scale`` (below 2^-24); None without a histogram."""
    counts = stats.get("log2_counts")
    if counts is None:
        return None
    total = sum(counts.values())
    if not total:
        return 0.0
    shift = math.log2(scale)
    flushed = sum(c for e, c in counts.items() if int(e) + 1 + shift <= FLOAT16_FLUSH_EXPONENT)
    return flushed / total


def gradient_histograms(diagnostics: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Each layer's weight-gradient exponent histogram, by layer path."""
    return {layer["layer"]: layer["weight_gradient"]["log2_counts"]
            for layer in diagnostics.get("layers", ())
            if (layer.get("weight_gradient") or {}).get("log2_counts") is not None}


def underflow_note(histograms: Mapping[str, Mapping[str, int]], scale: float) -> str:
    """``gradients float16 flushes to zero at scale 1: dense (100%), dense_1 (97%)``, the
    layers where at least NOTABLE_FLUSH of the weight gradients vanish ("" when none do)."""
    shares = {layer: flushed_fraction({"log2_counts": counts}, scale)
              for layer, counts in histograms.items()}
    notable = sorted(((share, layer) for layer, share in shares.items()
                      if share is not None and share >= NOTABLE_FLUSH), reverse=True)
    if not notable:
        return ""
    named = ", ".join(f"{layer} ({share:.0%})" for share, layer in notable[:NAMED_LAYERS])
    more = f" and {len(notable) - NAMED_LAYERS} more" if len(notable) > NAMED_LAYERS else ""
    return f"weight gradients float16 flushes to zero at scale {scale:g}: {named}{more}"


def trained_scale(result: TrialResult, config: PrecisionConfig) -> float:
    """The loss scale a float16 trial ended at: 1 without one, a fixed scale's value, where
    a dynamic scale had got to."""
    scale = config.loss_scale
    if scale.kind.fixed and scale.value:
        return scale.value
    if scale.kind.moves:
        return next((s for s in reversed(result.loss_scales) if s), scale.initial_scale)
    return 1.0
