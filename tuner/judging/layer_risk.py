"""Which layers float16 puts at risk, read from the diagnostics' per-layer ranges (plain data).

The worker's diagnostics (tuner.worker.diagnostics.layer_ranges) summarise every layer's
activations and gradients in float32 steps; from those summaries, ``risk_score`` weighs what a
layer stands to lose in float16 (overflow most, then underflow), ``float32_candidates`` ranks
the layers a config could keep in float32 (those whose inputs 16-bit rounding corrupts first,
then the riskiest), ``recommend_loss_scale`` picks the initial loss scale from the gradients'
range, and ``add_flushed_shares`` adds each layer's share of weight gradients float16 flushes at
scale 1 and at that scale (tuner.judging.underflow). Pure arithmetic on plain numbers.
"""

from __future__ import annotations

import math
from typing import Any

from tuner.judging.underflow import flushed_fraction

FLOAT16_MAX = 65504.0
FLOAT16_MIN_NORMAL = 2.0**-14
FLOAT16_MIN_SUBNORMAL = 2.0**-24
_LOSS_SCALE_HEADROOM = 2.0**15   # keep the scaled largest gradient below half of float16's max
_MAX_LOSS_SCALE_EXPONENT = 24
_MIN_CANDIDATE_RISK = 0.05  # e.g. 5% of activations flushing to zero, or any overflow


def risk_score(layer: dict[str, Any]) -> float:
    """How much a layer stands to lose in float16: overflow weighs most, then underflow."""
    act, grad = layer.get("activation") or {}, layer.get("gradient") or {}
    score = 10.0 * (act.get("overflow_fraction", 0) + grad.get("overflow_fraction", 0))
    score += 5.0 * act.get("non_finite_fraction", 0)
    if act.get("abs_max", 0) > FLOAT16_MAX / 4:
        score += 1.0  # near the edge: one more doubling overflows
    score += act.get("underflow_fraction", 0) + 0.5 * act.get("subnormal_fraction", 0)
    return score


def recommend_loss_scale(gradient_abs_max: float, gradient_p01: float) -> dict[str, float]:
    """The largest power of two that keeps the largest gradient below half of float16's max,
    and how many of the small gradients it lifts out of float16's subnormal range."""
    if gradient_abs_max <= 0:
        return {"initial_scale": 2.0**15, "exponent": 15, "lifts_p01_to_normal": False}
    exponent = math.floor(math.log2(_LOSS_SCALE_HEADROOM / gradient_abs_max))
    exponent = max(0, min(_MAX_LOSS_SCALE_EXPONENT, exponent))
    scale = 2.0**exponent
    return {"initial_scale": scale, "exponent": exponent,
            "lifts_p01_to_normal": bool(gradient_p01 * scale >= FLOAT16_MIN_NORMAL)}


def float32_candidates(layers: list[dict[str, Any]], rounded_inputs: list[str]) -> list[str]:
    """The float32 placement candidates: layers whose inputs 16-bit rounding corrupts silently
    (integers taken as floats, continuous features it cannot resolve) first, then the riskiest."""
    ranked = sorted((layer for layer in layers if layer["risk"] >= _MIN_CANDIDATE_RISK),
                    key=lambda layer: layer["risk"], reverse=True)
    candidates = list(dict.fromkeys(rounded_inputs))
    return candidates + [layer["layer"] for layer in ranked if layer["layer"] not in candidates]


def add_flushed_shares(layers: list[dict[str, Any]], recommended: float) -> None:
    """Each layer's share of weight gradients float16 flushes, at scale 1 and ``recommended``."""
    for layer in layers:
        if layer["weight_gradient"]:
            layer["weight_gradient_flushed"] = {
                "at_1": flushed_fraction(layer["weight_gradient"], 1.0),
                "at_recommended": flushed_fraction(layer["weight_gradient"], recommended)}
