"""Which stable trials are re-measured against float32: the fastest, less those that cannot win.

``finalists_of`` takes the ``plan.finalists`` fastest stable trials (search-phase medians),
leaving out a float16-compute config without a loss scale unless the diagnostics show its
gradients need none (``tuner.judging.decision.no_loss_scale_evidence``); ``clearly_behind``
drops those whose search-phase median is beyond the leader's by more than a run's drift, and
those the search placed below float32 beyond the run's drift (``below_float32``). Each
exclusion comes with a line for the summary; where none is left, ``why_no_finalist`` says why
float32 is the answer.
"""

from __future__ import annotations

import math

from tuner.judging.ceiling_limit import memory_still_bought
from tuner.judging.decision import no_loss_scale_evidence
from tuner.judging.noise import SEARCH_DRIFT, median, median_interval
from tuner.records.results import TrialRow
from tuner.run.plan import RunPlan
from tuner.trial_types import FailureClass


def finalists_of(plan: RunPlan, baseline: TrialRow, timed_stable: list[TrialRow]
                 ) -> tuple[list[TrialRow], list[str]]:
    """The fastest stable trials (of ``timed_stable``, fastest first), and a line for each
    float16 one without a loss scale left out for lack of evidence that it needs none
    (``no_loss_scale_evidence``)."""
    allowed, evidence = no_loss_scale_evidence(plan.learned.gradient_p01)
    stable, notes = [], []
    for row in timed_stable:
        if row is baseline:
            continue
        if row.config.float16_without_loss_scale and not allowed:
            notes.append(f"left #{row.number} ({row.config.describe()}) out of the finalists: "
                         f"{evidence}")
            continue
        stable.append(row)
    return stable[:plan.finalists], notes


def clearly_behind(leader: TrialRow | None,
                   finalists: list[TrialRow]) -> tuple[list[TrialRow], list[str]]:
    """The finalists worth re-measuring, and a line for each one dropped because even the
    fast end of its search-phase median's interval is beyond the leader's slow end by more
    than a run's drift (``SEARCH_DRIFT``): one run each cannot say more, and re-timing it
    would only spend the budget. ``leader``: the fastest stable trial."""
    if leader is None or not leader.result.timed_steps_ms:
        return finalists, []
    leader_low, leader_high = median_interval(leader.result.timed_steps_ms)
    kept, notes = [], []
    for row in finalists:
        low, high = median_interval(row.result.timed_steps_ms)
        if row is not leader and low > leader_high * SEARCH_DRIFT:
            notes.append(f"dropped #{row.number} ({row.config.describe()}) before the "
                         f"re-measurement: its search-phase median step lies in [{low:.3g}-"
                         f"{high:.3g}] ms, beyond #{leader.number}'s [{leader_low:.3g}-"
                         f"{leader_high:.3g}] ms by more than a run's "
                         f"{SEARCH_DRIFT - 1:.0%} drift")
        else:
            kept.append(row)
    return kept, notes


def below_float32(base: TrialRow | None,
                  finalists: list[TrialRow]) -> tuple[list[TrialRow], list[str]]:
    """The finalists the search did not place below float32, and a line for each it did: the
    top of its speedup over float32 from the two search-phase medians stays under 1, with the
    medians' own intervals (``median_interval``) and a run's drift (``SEARCH_DRIFT``) added
    in quadrature (in logs: three independent errors). ``clearly_behind`` adds them end to
    end against the leader, which keeps a 16-bit finalist 10-15% slower than float32 in
    the rounds, to be timed only to confirm it slower. Only where both ran with the node to
    themselves: a trial timed beside another reads up to 1.5x slow."""
    if base is None or not base.result.timed_steps_ms or not base.result.exclusive_timing:
        return finalists, []
    base_ms = median(base.result.timed_steps_ms)
    base_high = median_interval(base.result.timed_steps_ms)[1]
    kept, notes = [], []
    for row in finalists:
        if not row.result.timed_steps_ms or not row.result.exclusive_timing:
            kept.append(row)
            continue
        row_ms = median(row.result.timed_steps_ms)
        low = median_interval(row.result.timed_steps_ms)[0]
        noise = math.sqrt(math.log(base_high / base_ms) ** 2 + math.log(row_ms / low) ** 2
                          + math.log(SEARCH_DRIFT) ** 2)
        top = base_ms / row_ms * math.exp(noise)
        if top < 1.0:
            notes.append(f"dropped #{row.number} ({row.config.describe()}) before the "
                         f"re-measurement: the search placed it below float32 beyond a run's "
                         f"{SEARCH_DRIFT - 1:.0%} drift ({base_ms / row_ms:.2f}x float32's "
                         f"speed from the search's medians, at most {top:.2f}x with their "
                         f"noise)")
        else:
            kept.append(row)
    return kept, notes


def why_no_finalist(plan: RunPlan, baseline: TrialRow, rows: list[TrialRow],
                    unscaled: list[str], dropped: list[str]) -> tuple[str, list[str]]:
    """Why float32 is the answer when no finalist is left to time, and the summary's lines:
    the device's ceiling left no 16-bit policy (``Learned.float32_by_ceiling``: with what
    16-bit would still buy, from the baseline's training memory, and the flag that tries it
    anyway), no 16-bit config reached the model, none was stable, or each was left out
    (``unscaled``, ``finalists_of``) or dropped (``dropped``, this module's rules)."""
    if plan.learned.float32_by_ceiling and not (unscaled or dropped):
        why = plan.learned.float32_by_ceiling
        memory = memory_still_bought(baseline.result.training_memory)
        return why, [f"{why}: float32, answered after its baseline; nothing to re-measure",
                     *([memory] if memory else []),
                     "pass --keep-slow-policies to train the 16-bit policies anyway"]
    dropped = unscaled + dropped
    unreached = [row.result.failure_message for row in rows
                 if row.result.failure_class is FailureClass.PRECISION_UNREACHED]
    why = (f"no 16-bit config reached the model: {unreached[0]}" if unreached and not dropped
           else "no stable config besides float32" if not dropped else
           "every stable 16-bit config was left out or is clearly slower than float32"
           if unscaled else
           "every stable 16-bit config is clearly slower than float32")
    return why, [f"{why}: nothing to re-measure", *dropped]
