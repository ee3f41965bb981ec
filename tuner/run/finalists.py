"""Which stable trials are re-measured against float32: the fastest, less those that cannot win.

``finalists_of`` takes the ``plan.finalists`` fastest stable trials (search-phase medians),
leaving out a float16-compute config without a loss scale unless the diagnostics show its
gradients need none (``tuner.judging.decision.no_loss_scale_evidence``); ``clearly_behind``
drops those whose search-phase median is beyond the leader's by more than a run's drift. Each
exclusion comes with a line for the summary.
"""

from __future__ import annotations

from tuner.judging.decision import no_loss_scale_evidence
from tuner.judging.noise import SEARCH_DRIFT, median_interval
from tuner.records.results import TrialRow
from tuner.run.trial_loop import Scheduler


def finalists_of(scheduler: Scheduler) -> tuple[list[TrialRow], list[str]]:
    """The fastest stable trials, and a line for each float16 one without a loss scale left out
    for lack of evidence that it needs none (``no_loss_scale_evidence``)."""
    allowed, evidence = no_loss_scale_evidence(scheduler.plan.gradient_p01)
    stable, notes = [], []
    for row in scheduler.timed_stable_rows():
        if row is scheduler.baseline:
            continue
        if row.config.float16_without_loss_scale and not allowed:
            notes.append(f"left #{row.number} ({row.config.describe()}) out of the finalists: "
                         f"{evidence}")
            continue
        stable.append(row)
    return stable[:scheduler.plan.finalists], notes


def clearly_behind(scheduler: Scheduler,
                   finalists: list[TrialRow]) -> tuple[list[TrialRow], list[str]]:
    """The finalists worth re-measuring, and a line for each one dropped because even the
    fast end of its search-phase median's interval is beyond the leader's slow end by more
    than a run's drift (``SEARCH_DRIFT``): one run each cannot say more, and re-timing it
    would only spend the budget."""
    leader = scheduler.best_stable()
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
