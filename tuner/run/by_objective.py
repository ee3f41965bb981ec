"""The choice under ``--objective memory`` or ``balanced``: finalists, re-measurement and
confirmation in the objective's order.

``tuner.judging.objective.ranked`` orders the stable trials with a memory figure by the
objective (memory: the smallest training memory first; balanced: the fastest on the front within
the memory slack, then the same among the rest), up to ``plan.finalists`` of them, stopping at
float32 (which needs no confirmation and is the answer when none holds). They are re-measured
against float32 for their speed intervals (``tuner.run.remeasure.Rounds`` with ``by_speed``
off: no finalist is dropped for speed), and confirmed in that order: when the confirmation
rejects the first, the next by the objective is confirmed, each rejection with its reason in
the summary; float32 is exported only when none holds.
"""

from __future__ import annotations

from tuner.judging.decision import Candidate, Decision, decide
from tuner.judging.noise import SpeedupEstimate
from tuner.judging.objective import Point, pareto_front, ranked
from tuner.records.results import TrialRow
from tuner.run.remeasure import Remeasured, Rounds, remeasure
from tuner.run.trial_loop import Scheduler

MAX_ATTEMPTS = 3   # configs confirmed at most, one after another


def _points(scheduler: Scheduler) -> tuple[dict[int, TrialRow], list[Point], list[str]]:
    """The stable trials the objective can rank (a memory figure, and for float16 without a
    loss scale the evidence that it needs none), as points; and a line for each left out
    because its memory could not be counted."""
    rows = {r.number: r for r in scheduler.ranked_stable_rows()}
    points = [Point(r.number, r.config, r.judgement.median_step_ms,
                    int(r.result.training_memory["total_bytes"])) for r in rows.values()]
    uncounted = [f"left #{r.number} ({r.config.describe()}) out: its training memory could "
                 f"not be counted ({r.result.memory_error or 'no figure'})"
                 for r in scheduler.timed_stable_rows() if not r.result.training_memory]
    return rows, points, uncounted


def remeasure_by_objective(scheduler: Scheduler) -> Remeasured:
    plan, baseline = scheduler.plan, scheduler.baseline
    rows, points, uncounted = _points(scheduler)
    if not points:
        baseline.estimate = SpeedupEstimate.identity()
        return Remeasured(baseline, decide(baseline.number, [], min_gain=plan.min_gain),
                          ["no stable config has a memory figure: float32"],
                          objective_lines=uncounted)
    order = ranked(points, plan.objective, plan.memory_slack, count=plan.finalists)
    finalists = []
    for point, _ in order:
        if rows[point.number] is baseline:
            break
        finalists.append(rows[point.number])
    why = order[0][1]
    reasons = {point.number: reason for point, reason in order}
    lines = [why] + [f"then #{point.number} ({point.config.describe()}): {reason}"
                     for point, reason in order[1:len(finalists)]] + uncounted
    if plan.objective.shows_front:
        lines += [f"front: {point.describe()}" for point in pareto_front(points)]
    if not finalists:
        baseline.estimate = SpeedupEstimate.identity()
        return Remeasured(baseline, Decision(baseline.number, baseline.estimate, False, why),
                          ["the pick is float32: nothing to re-measure"], objective_lines=lines)
    def choose(left: list[Candidate]) -> Decision:
        """The first of ``left`` (in the objective's order), its speed as measured."""
        chosen = left[0]
        estimate = chosen.estimate.across_runs(plan.run_drift)
        return Decision(chosen.number, estimate, False,
                        f"the next by objective {plan.objective}: #{chosen.number} "
                        f"({chosen.config.describe()}), {estimate.describe()} vs float32")

    def chosen_by_objective(rounds: Rounds, count: int) -> Remeasured:
        timed = [row for row in finalists if row in rounds.active and row.estimate is not None]
        if not timed:
            baseline.estimate = SpeedupEstimate.identity(count)
            return Remeasured(baseline, Decision(baseline.number, baseline.estimate, False,
                                                 f"{why}, but every finalist was lost in the "
                                                 "re-measurement: float32"),
                              rounds.notes, rounds.shared, lines)
        first = timed[0]
        lost = "".join(f"#{row.number} was lost in the re-measurement; "
                       for row in finalists[:finalists.index(first)])
        decision = choose(rounds.candidates)
        decision = Decision(decision.winner, decision.estimate, False,
                            f"{lost}{reasons[first.number]}; {decision.estimate.describe()} "
                            "vs float32")
        return Remeasured(first, decision, rounds.notes, rounds.shared, lines)

    return Rounds(scheduler, baseline, finalists, decide=chosen_by_objective, choose_next=choose,
                  max_attempts=MAX_ATTEMPTS).run()



def winner_of(scheduler: Scheduler) -> Remeasured:
    """The re-measured, confirmed pick under the plan's objective."""
    if scheduler.plan.objective.decided_by_speed:
        return remeasure(scheduler)
    return remeasure_by_objective(scheduler)
