"""Why the exported float16 config has the loss scale it has: one sentence for its provenance.

A short trial can judge where a scale starts (too high: it backs off, skipping steps; too low:
small gradients flush and it learns less) but not how often it grows, so the sentence says
where the initial scale came from, what the pick's own trial saw of it, and why its growth
interval is what it is.
"""

from __future__ import annotations

import math

from tuner.apply.config import PrecisionConfig, compute_dtype_of
from tuner.apply.config import power_of_two as _power
from tuner.judging.decision import no_loss_scale_evidence
from tuner.run.plan import RunPlan
from tuner.trial_types import TrialResult


def _origin(start: float, plan: RunPlan) -> str:
    recommended = plan.learned.recommended_scale
    if not recommended or not plan.space.auto_initial_scale:
        return "from the space's initial_scales"
    largest = f" (largest weight gradient {plan.learned.gradient_abs_max:.3g})" \
        if plan.learned.gradient_abs_max else ""
    steps = round(math.log2(start / recommended)) if start > 0 else 0
    where = "the diagnostics' recommendation" if steps == 0 else \
        f"{abs(steps)} powers of two {'above' if steps > 0 else 'below'} the diagnostics' " \
        f"recommendation, {_power(recommended)}"
    return f"{where}{largest}, searched against its neighbours"


def _seen(result: TrialResult) -> str:
    scales = [s for s in result.loss_scales if s]
    if not scales:
        return ""
    end = scales[-1]
    skipped = f", skipping {result.skipped_steps} of {len(result.losses)} steps" \
        if result.skipped_steps else ", skipping no step"
    moved = f"ended at {_power(end)}" if end != scales[0] else f"stayed at {_power(end)}"
    return f"; in its trial it {moved}{skipped}"


def loss_scale_why(config: PrecisionConfig, result: TrialResult, plan: RunPlan) -> str | None:
    """The sentence, or None where the config does not compute in float16."""
    if compute_dtype_of(config.policy) != "float16":
        return None
    scale = config.loss_scale
    if not scale.kind.scales:
        return "no loss scale: " + no_loss_scale_evidence(plan.learned.gradient_p01)[1]
    if scale.kind.fixed:
        return (f"fixed at {_power(scale.value)}, from the space's fixed_values"
                f"{_seen(result)}")
    growth = f"grows after {scale.growth_steps} overflow-free steps: " + (
        "no trial is long enough to see a growth at any interval the space lists, so they "
        "were searched as one, the largest" if plan.learned.growth_note else
        "the only growth interval the space lists" if len(plan.space.growth_steps) == 1 else
        "the searched interval of the fastest stable trial")
    start = scale.initial_scale
    return f"dynamic, starts at {_power(start)}: {_origin(start, plan)}{_seen(result)}; {growth}"
