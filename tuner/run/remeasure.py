"""Re-timing the finalists against float32: the measurements the winner is decided on.

Search-phase medians only screen (one run each, possibly beside another trial). Here:
- The ``plan.finalists`` fastest stable trials and float32 run on one worker that has its node
  to itself (``executor.exclusive()``); a finalist the search placed clearly behind the leader
  or below float32 (``tuner.run.finalists``) is dropped first, with a line saying so.
- Each run trains a quarter of a trial's steps (``Remeasurement.run_share``): much of a
  round's spread is the level moving between runs, so short runs bring nearly as much a round.
- Each config's model is built and traced once and kept alive in the worker; every later run
  trains it on (``tuner.worker.trial.live``), the float32 baseline trial's included.
- A warm-up run of float32 comes first, discarded (a fresh worker's first run was 46% slow).
- Rounds: each runs float32 and every finalist once, in an order that rotates each round and
  reverses each cycle (AB BA BA AB): no config always runs first.
- From ``min_rounds`` on, a finalist whose interval lies wholly below the leader's is dropped,
  and so is one whose interval lies wholly below float32 + ``min_gain`` while another's still
  reaches it (it cannot be picked). Rounds stop once no finalist can clear float32 + ``min_gain``
  even at its interval's top end (``none_can_clear``: also before ``min_rounds``, as it can
  only answer float32), or one finalist left clears it, or the leader's interval is within
  ``target_half_width``, or more rounds cannot change the pick (``settled``), or at
  ``max_rounds``, or after ``time_cap_s`` or half the job's time before the rounds (start-up,
  checks, search) or the search's own time, whichever is less (never under ``MIN_CAP_S``:
  verifying costs at most a third of the time to the pick); the notes say which.
- A run that fails (crash, timeout, non-finite loss) drops that finalist, named in the notes;
  the session goes on in a fresh worker, which builds its models again.

Past 300 lines: the rounds' stop rules share the rounds' state (``Rounds``), one class.
Then ``tuner.judging.decision.decide`` names the winner (against float32 with the run-to-run
allowance, ``plan.run_drift``), and ``tuner.run.confirmation_run`` confirms it: its validation
over a longer run and, on fresh runs it was not chosen on, its speed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from tuner import interrupt
from tuner.errors import TunerError
from tuner.judging.decision import (
    Candidate,
    Decision,
    decide,
    no_loss_scale_evidence,
    none_can_clear,
    settled,
)
from tuner.judging.noise import (
    PooledNoise,
    SpeedupEstimate,
    projected_speedup,
    round_log_ratios,
    speedup_from_log_ratios,
)
from tuner.records.results import TrialRow
from tuner.run.confirmation_run import MAX_ATTEMPTS, Confirmation, Confirmer, confirm_pick
from tuner.run.finalists import below_float32, clearly_behind, finalists_of, why_no_finalist
from tuner.run.trial_loop import Scheduler, make_spec
from tuner.trial_types import TrialOutcome, TrialResult

MIN_CAP_S = 5.0   # a search of a few seconds still leaves the rounds time beyond their minimum
# The rounds spend at most this share of the job's time before them (start-up, checks, search):
# verifying then costs at most a third of the wall time up to the pick.
VERIFY_SHARE = 0.5


@dataclass
class Remeasured:
    winner: TrialRow
    decision: Decision
    notes: list[str] = field(default_factory=list)
    shared: bool = False                 # the timings were not exclusive (busy cluster)
    objective_lines: list[str] = field(default_factory=list)  # memory/balanced: the choice
    confirmations: list[Confirmation] = field(default_factory=list)  # in the order run
    confirm_skipped: bool = False        # --no-confirm


def remeasure(scheduler: Scheduler) -> Remeasured:
    """The speed objective's finalists re-timed, the winner decided and confirmed (memory and
    balanced: tuner.run.by_objective)."""
    baseline = scheduler.baseline
    if baseline is None:
        raise TunerError("no float32 baseline to re-measure against")
    finalists, unscaled = finalists_of(scheduler.plan, baseline, scheduler.timed_stable_rows())
    finalists, below = below_float32(baseline, finalists)
    finalists, behind = clearly_behind(scheduler.best_stable(), finalists)
    if not finalists:  # nothing to time: float32, and why
        baseline.estimate = SpeedupEstimate.identity()
        why, notes = why_no_finalist(scheduler.plan, baseline, scheduler.rows, unscaled,
                                     below + behind)
        return Remeasured(baseline, Decision(baseline.number, baseline.estimate, False, why),
                          notes)
    outcome = Rounds(scheduler, baseline, finalists).run()
    outcome.notes[1:1] = unscaled + below + behind
    config = outcome.winner.config
    if config.float16_without_loss_scale:
        outcome.notes.append("the pick has no loss scale: "
                             + no_loss_scale_evidence(scheduler.plan.learned.gradient_p01)[1])
    return outcome


def _why_lost(result: TrialResult) -> str:
    if result.outcome is TrialOutcome.DIVERGED:
        return f"loss non-finite at step {result.first_non_finite_step}"
    return result.failure_message or result.stop_reason or "no timed steps"


class Rounds:
    def __init__(self, scheduler: Scheduler, baseline: TrialRow, finalists: list[TrialRow], *,
                 decide: Callable[[Rounds, int], Remeasured] | None = None,
                 choose_next: Callable[[list[Candidate]], Decision] | None = None,
                 max_attempts: int = MAX_ATTEMPTS) -> None:
        self.scheduler = scheduler
        self.plan = scheduler.plan
        self.policy = scheduler.plan.remeasurement
        self.baseline = baseline
        self.active = list(finalists)
        self.count = len(finalists)
        self.notes: list[str] = []
        self.shared = False
        # (rounds, count) -> Remeasured: the pick once the rounds end (the objective's own
        # choice under memory and balanced: tuner.run.by_objective)
        self.decide = decide or Rounds._decide
        # memory/balanced (tuner.run.by_objective): the finalists come in the objective's
        # order and are timed for their intervals only; speed drops no finalist.
        self.by_speed = self.plan.objective.decided_by_speed
        self.choose_next = choose_next   # the next pick after a rejected confirmation
        self.max_attempts = max_attempts
        self.candidates: list[Candidate] = []
        self.at_cap: dict[int, SpeedupEstimate | None] = {}
        self.pooled: PooledNoise | None = None   # the rounds' spread, over every finalist
        for row in [baseline, *finalists]:
            row.remeasured_rounds = []

    def run(self) -> Remeasured:
        scheduler, policy = self.scheduler, self.policy
        scheduler.progress.phase(
            f"re-measuring float32 and {len(self.active)} finalist(s) back to back, "
            f"{policy.min_rounds}-{policy.max_rounds} rounds")
        started = time.perf_counter()
        stop = ""
        with scheduler.executor.exclusive() as session:
            self.shared = not session.exclusive_timing
            self._time(session, self.baseline)          # warm-up run, discarded
            self.baseline.remeasured_rounds = []
            rounds = 0
            while not stop:
                round_started = time.perf_counter()
                self._round(session, rounds)
                rounds += 1
                # The time caps count the next round too: stop before it would pass them.
                now = time.perf_counter()
                stop = self._stop_reason(rounds, now - started + now - round_started)
            self.notes.insert(0, f"re-measured float32 and {self.count} finalist(s) in "
                                 f"{rounds} rounds, stopped by {stop}")
            self.candidates = [Candidate(r.number, r.config, r.estimate) for r in self.active
                               if r.estimate is not None]
            return self._confirm(session, self.decide(self, rounds), rounds)

    def _confirm(self, session, outcome: Remeasured, rounds: int) -> Remeasured:
        """The pick, and the next ones if it fails, trained on against float32 before export."""
        def run(row: TrialRow, train_to: int, validate: bool) -> TrialResult:
            # The confirmation trains to its own budget (tuner.run.confirmation_run), not the
            # trials'.
            spec = dataclasses.replace(make_spec(self.plan, row.number, row.config),
                                       validate=validate, train_to=train_to, time_bound_s=None)
            return self.scheduler.account(session.run(spec, self.plan.trial_time_limit_s),
                                          phase="confirmation")

        by_speed = self.plan.objective.decided_by_speed
        confirmer = Confirmer(run, self.plan.confirm, self.plan.steps, self.scheduler.progress,
                              min_gain=self.plan.min_gain if by_speed else None,
                              noise=self.pooled, run_drift=self.plan.run_drift)
        return confirm_pick(outcome, confirmer, self.baseline, self.candidates,
                            {r.number: r for r in self.scheduler.rows},
                            min_gain=self.plan.min_gain, rounds=rounds,
                            choose=self.choose_next, max_attempts=self.max_attempts)

    def run_steps(self) -> int:
        """Steps in one run: ``policy.run_share`` of a trial's, with at least
        ``policy.min_run_steps`` timed after the warm-up steps, at most a trial's."""
        plan, policy = self.plan, self.policy
        share = math.ceil(plan.steps * policy.run_share)
        return min(plan.steps, max(share, plan.warmup_steps + policy.min_run_steps))

    def _time(self, session, row: TrialRow) -> list[float] | None:
        """One run of ``row``'s config (on the model the session keeps alive for it: built and
        traced once); its timed steps, or None when the run failed. Stability was judged in
        the search: here a run counts unless it failed, diverged or timed nothing."""
        spec = dataclasses.replace(make_spec(self.plan, row.number, row.config),
                                   steps=self.run_steps())
        result = self.scheduler.account(session.run(spec, self.plan.trial_time_limit_s),
                                        phase="re-measurement")
        if not result.exclusive_timing:
            self.shared = True
        if result.outcome is not TrialOutcome.COMPLETED or not result.timed_steps_ms:
            if row is not self.baseline:
                self.active.remove(row)
                self.notes.append(f"lost #{row.number} ({row.config.describe()}) in the "
                                  f"re-measurement: {_why_lost(result)}")
            return None
        return list(result.timed_steps_ms)

    def _round(self, session, index: int) -> None:
        order = [self.baseline, *self.active]
        shift = index % len(order)
        order = order[shift:] + order[:shift]
        if (index // len(order)) % 2:   # reversing on odd rounds kept 2 configs' order fixed
            order.reverse()
        for row in order:
            if row is self.baseline or row in self.active:
                steps = self._time(session, row)
                row.remeasured_rounds.append(steps or [])
                interrupt.raise_if_requested()
        if not any(self.baseline.remeasured_rounds):
            raise TunerError("re-measuring the float32 baseline failed; cannot name a winner. "
                             "Is the machine overloaded or out of memory?")

    def _estimates(self) -> dict[int, SpeedupEstimate]:
        """Each active finalist's speedup (the noise pooled over all), and its interval at the
        round cap (``projected_speedup``) for ``_settled``."""
        ratios = {row.number: round_log_ratios(self.baseline.remeasured_rounds,
                                               row.remeasured_rounds) for row in self.active}
        pooled = self.pooled = PooledNoise.of(list(ratios.values())) or self.pooled
        estimates = {}
        self.at_cap = {}
        for row in self.active:
            if ratios[row.number]:
                row.estimate = speedup_from_log_ratios(ratios[row.number], pooled)
                estimates[row.number] = row.estimate
                self.at_cap[row.number] = projected_speedup(ratios[row.number], pooled,
                                                            self.policy.max_rounds)
        return estimates

    def _settled(self) -> str:
        """Why more rounds cannot change the pick (``tuner.judging.decision.settled``), or ""."""
        now = [Candidate(r.number, r.config, r.estimate) for r in self.active if r.estimate]
        if len(now) != len(self.active) or any(self.at_cap.get(c.number) is None for c in now):
            return ""
        return settled(self.baseline.number, now, self.at_cap, min_gain=self.plan.min_gain,
                       cap=self.policy.max_rounds, run_drift=self.plan.run_drift)

    def _stop_reason(self, rounds: int, elapsed_s: float) -> str:
        policy = self.policy
        if not self.active:
            return "every finalist was lost"
        if self.by_speed and rounds < policy.min_rounds:   # only the stop answering float32
            return self._none_can_clear(rounds) if self._estimates() else ""
        if rounds < policy.min_rounds:
            return ""
        estimates = self._estimates()
        if not estimates:
            return "no finalist could be paired with a float32 round"
        if not self.by_speed:   # the first in the objective's order that has an interval
            return self._limit_reason(rounds, elapsed_s,
                                      next(r for r in self.active if r.estimate))
        leader = max(self.active, key=lambda r: r.estimate.ratio if r.estimate else 0.0)
        for row in list(self.active):
            if row is not leader and row.estimate and row.estimate.high < leader.estimate.low:
                self.active.remove(row)
                self.notes.append(f"dropped #{row.number} after {rounds} rounds: "
                                  f"{row.estimate.describe()}, clearly behind #{leader.number} "
                                  f"({leader.estimate.describe()})")
        bar = 1.0 + self.plan.min_gain
        if self._drop_below(bar, rounds):
            leader = max(self.active, key=lambda r: r.estimate.ratio)
        width = leader.estimate.relative_half_width
        cannot = self._none_can_clear(rounds)   # every interval below the bar, among others
        if cannot:
            return f"{cannot} (leader's interval +-{width:.1%})"
        if len(self.active) == 1 and leader.estimate.across_runs(self.plan.run_drift).clears(bar):
            return f"one finalist left, clearly ahead of float32 (+-{width:.1%})"
        settled = self._settled() if policy.settle and rounds < policy.max_rounds else ""
        if settled and width > policy.target_half_width:
            return f"{settled} (leader's interval +-{width:.1%})"
        return self._limit_reason(rounds, elapsed_s, leader)

    def _none_can_clear(self, rounds: int) -> str:
        """``tuner.judging.decision.none_can_clear`` over the active finalists."""
        rows = [r for r in self.active if r.estimate is not None]
        if not rows or len(rows) != len(self.active):
            return ""
        return none_can_clear([Candidate(r.number, r.config, r.estimate) for r in rows],
                              min_gain=self.plan.min_gain, run_drift=self.plan.run_drift,
                              rounds=rounds)

    def _time_cap_s(self) -> float:
        """The policy's cap, ``VERIFY_SHARE`` of the time before, or the search's: the least."""
        phases = self.scheduler.clock.phases
        before_s = sum(seconds for phase, seconds in phases.items() if phase != "re-measurement")
        share = min(VERIFY_SHARE * before_s, phases.get("trials", 0.0))
        return min(self.policy.time_cap_s, max(MIN_CAP_S, share))

    def _limit_reason(self, rounds: int, elapsed_s: float, leader: TrialRow) -> str:
        """The stops that serve every objective: the leader's interval narrow enough, the
        round cap, the time cap."""
        policy = self.policy
        width = leader.estimate.relative_half_width
        if width <= policy.target_half_width:
            return (f"the leader's interval reached the +-{policy.target_half_width:.0%} target "
                    f"(+-{width:.1%})")
        if rounds >= policy.max_rounds:
            return f"the {policy.max_rounds}-round cap (leader's interval +-{width:.1%})"
        cap = self._time_cap_s()
        if elapsed_s >= cap:
            return (f"the {cap:.0f} s time cap (half the job's time before the rounds, at most "
                    f"the search's; leader's interval +-{width:.1%})"
                    if cap < policy.time_cap_s else
                    f"the {cap:.0f} s time cap (leader's interval +-{width:.1%})")
        return ""

    def _drop_below(self, bar: float, rounds: int) -> bool:
        """Drop the finalists whose whole interval lies below ``bar`` (float32 + the minimum
        gain) while another finalist's still reaches it: none of them can be picked
        (``decide`` needs the interval's low end above the bar), so timing them on only spends
        the rounds. When every finalist lies below, the rounds stop instead (float32 wins)."""
        below = [r for r in self.active if r.estimate and r.estimate.high < bar]
        if not below or len(below) == len(self.active):
            return False
        for row in below:
            self.active.remove(row)
            self.notes.append(f"dropped #{row.number} after {rounds} rounds: "
                              f"{row.estimate.describe()}, below float32 + "
                              f"{self.plan.min_gain:.0%}, so it cannot be picked")
        return True

    def _decide(self, rounds: int) -> Remeasured:
        self.baseline.estimate = SpeedupEstimate.identity(rounds)
        decision = decide(self.baseline.number, self.candidates, min_gain=self.plan.min_gain,
                          baseline_rounds=rounds, run_drift=self.plan.run_drift)
        rows = {r.number: r for r in self.scheduler.rows}
        return Remeasured(rows[decision.winner], decision, self.notes, self.shared)
