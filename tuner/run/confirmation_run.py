"""The confirmation run: does the pick train as well as float32 over a longer run?

A search trial is short (tens to hundreds of steps), and a config can pass it and still train
to a worse model: a plateau that float32 passes later, rounding that only matters once the
loss is small. So before a 16-bit pick is exported, it and float32 train on, side by side, on
their live models in the re-measurement's exclusive worker (``tuner.worker.trial.live``), for a
longer budget, and are evaluated on the run's validation batches at ``CHECKPOINTS`` points. The
pick is confirmed when no loss went non-finite and its validation loss at the end is within
float32's noise and the level allowance (``tuner.judging.verdict.validation_gap``, the rule a search
trial's validation is judged by). Otherwise the next finalist the decision would pick is
confirmed in the same way (at most ``MAX_ATTEMPTS`` configs), else float32 is the answer; the
summary says why.

The budget: ``--confirm-steps`` more steps, by default ``STEPS_MULTIPLE`` times a trial's, cut
to what fits in ``--confirm-seconds`` of both models' training at their re-measured step
times. What it guarantees: over that many steps of the task's own data and optimizer, the
pick's validation loss stayed within noise of float32's. What it does not: a training many
times longer (a late divergence, a schedule that lowers the learning rate) is not run.

The same runs re-check the pick's **speed** on data it was not chosen on. The finalists' rounds
pick the fastest of several noisy estimates and stop once one looks clear, so the winner's
interval is biased its way: on a 3 ms-per-step model whose rounds' medians varied 1.6-5.0 ms,
2 of 10 tunes exported a config at 1.35-1.40x whose independent A/B in fresh processes read
0.80-0.84x. The confirmation's stretches alternate float32 and the pick back to back
(``CHECKPOINTS`` pairs, each several trials long), so their timed steps are fresh paired
rounds: the pick is exported only if its speedup over them still clears float32 +
``min_gain``, and that is the speedup the export reports (``Confirmation.speed``; the rounds'
stay in trials.json), widened by the run-to-run allowance (``tuner.judging.noise``) as every
speedup over float32 is. With ``--no-confirm`` the same pairs run as a speed check alone, a
trial's length each, without validation.

Pure driver code: the runs go through the executor's exclusive session; no TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from tuner.judging.decision import DEFAULT_MIN_GAIN, decide
from tuner.judging.noise import (
    PooledNoise,
    SpeedupEstimate,
    round_log_ratios,
    speedup_from_log_ratios,
)
from tuner.judging.terms import stretch_terms_gap
from tuner.judging.verdict import (
    LEVEL_ALLOWANCE,
    NOISE_SIGMAS,
    level_gap,
    metric_gap,
    standard_error,
    validation_failure,
    validation_gap,
)
from tuner.run.confirmation_findings import Checkpoint, Confirmation
from tuner.trial_types import TrialOutcome, TrialResult

CHECKPOINTS = 4
STEPS_MULTIPLE = 10
DEFAULT_SECONDS = 20.0
MAX_ATTEMPTS = 2


@dataclass(frozen=True)
class ConfirmBudget:
    """How long the confirmation trains: ``steps`` (None: ``STEPS_MULTIPLE`` trials' worth,
    capped by ``seconds`` of training); ``enabled`` False: skipped (``--no-confirm``)."""

    enabled: bool = True
    steps: int | None = None
    seconds: float = DEFAULT_SECONDS

    def extra_steps(self, trial_steps: int, ms_per_step_both: float | None) -> tuple[int, str]:
        """The steps to train past where the models are, and why that many."""
        if self.steps is not None:
            return self.steps, f"--confirm-steps {self.steps}"
        wanted = STEPS_MULTIPLE * trial_steps
        if ms_per_step_both and ms_per_step_both > 0:
            fits = int(self.seconds * 1000.0 / ms_per_step_both)
            if fits < wanted:
                return max(CHECKPOINTS, fits), (f"as many as fit in {self.seconds:g} s "
                                                f"(--confirm-seconds); {wanted} wanted")
        return wanted, f"{STEPS_MULTIPLE}x a trial's {trial_steps} steps"


class Confirmer:
    """Runs the confirmation of a config against float32. ``run(row, train_to, validate)``
    trains the row's live model until it has trained ``train_to`` steps in all, then validates
    it when ``validate`` (a ``TrialSpec`` with ``train_to`` and ``validate`` on the exclusive
    session). ``noise``: the rounds' pooled spread, the floor of the speed check's (its own
    few pairs may agree by chance); ``min_gain``: the bar the pick's speed must still clear
    (None: the pick was chosen for its memory, and its speed is reported, not required)."""

    def __init__(self, run: Callable[[Any, int, bool], TrialResult], budget: ConfirmBudget,
                 trial_steps: int, progress, *, min_gain: float | None = DEFAULT_MIN_GAIN,
                 noise: PooledNoise | None = None, run_drift: float = 0.0) -> None:
        self.run = run
        self.run_drift = run_drift
        self.budget = budget
        self.trial_steps = trial_steps
        self.progress = progress
        self.min_gain = min_gain
        self.noise = noise

    def confirm(self, baseline, pick) -> Confirmation:
        started = time.perf_counter()
        quality = self.budget.enabled
        both_ms = (baseline.remeasured_ms or baseline.judgement.median_step_ms or 0.0) + \
            (pick.remeasured_ms or pick.judgement.median_step_ms or 0.0)
        if quality:
            extra, why = self.budget.extra_steps(self.trial_steps, both_ms)
            self.progress.phase(
                f"confirming #{pick.number} ({pick.config.describe()}) against float32: "
                f"{extra} more steps each, validated at {CHECKPOINTS} points")
        else:
            extra = CHECKPOINTS * self.trial_steps
            why = f"{CHECKPOINTS} stretches of a trial's {self.trial_steps} steps, timed only"
            self.progress.phase(
                f"checking #{pick.number}'s speed against float32: {CHECKPOINTS} fresh "
                "stretches each, back to back")
        outcome = Confirmation(pick.number, pick.config.describe(), False, "", extra, why,
                               quality=quality)

        def run(row, train_to: int) -> TrialResult:
            return self.run(row, train_to, quality)

        # Where each live model is (float32 ran one more warm-up run): both start level.
        where = {id(row): run(row, 0) for row in (baseline, pick)}
        for row in (baseline, pick):
            problem = _problem(where[id(row)], row is baseline)
            if problem:
                return self._end(outcome, problem, started)
        start = max(result.trained_steps or 0 for result in where.values())
        chunk = max(1, math.ceil(extra / CHECKPOINTS))
        for index in range(CHECKPOINTS):
            target = start + chunk * (index + 1)
            order = (baseline, pick) if index % 2 == 0 else (pick, baseline)
            results = {}
            for row in order:
                results[id(row)] = result = run(row, target)
                problem = _problem(result, row is baseline)
                if problem:
                    return self._end(outcome, problem, started)
            mine, base = results[id(pick)], results[id(baseline)]
            failure = validation_failure(mine.validation, base.validation) if quality else ""
            if failure:
                return self._end(outcome, f"at step {target}, the pick's {failure}", started)
            outcome.checkpoints.append(Checkpoint(
                target, base.validation or {}, mine.validation or {}, base.losses, mine.losses,
                base.timed_steps_ms, mine.timed_steps_ms, base.loss_terms, mine.loss_terms))
        speed = _paired_speed(outcome.checkpoints, self.noise)
        outcome.speed = speed.across_runs(self.run_drift) if speed else None
        problem = (_final_gap(outcome) if quality else "") or \
            _speed_gap(outcome.speed, pick.estimate, self.min_gain)
        return self._end(outcome, problem, started)

    @staticmethod
    def _end(outcome: Confirmation, problem: str, started: float) -> Confirmation:
        outcome.passed, outcome.reason = not problem, problem
        if outcome.checkpoints and outcome.quality:
            last = outcome.checkpoints[-1]
            scatter = last.float32_losses if outcome.fallback else \
                last.float32.get("batch_losses") or []
            outcome.noise = NOISE_SIGMAS * standard_error(scatter)
        outcome.seconds = time.perf_counter() - started
        return outcome


def _problem(result: TrialResult, is_float32: bool) -> str:
    """Why this confirmation run cannot confirm the pick ("" when it can go on)."""
    who = "float32's run" if is_float32 else "the pick's run"
    if result.outcome is TrialOutcome.DIVERGED:
        return f"{who} reached a non-finite loss at step {result.trained_steps or '?'}"
    if result.outcome is not TrialOutcome.COMPLETED:
        return f"{who} failed: {result.failure_message or result.stop_reason or 'no result'}"
    validation = result.validation or {}
    if not is_float32 and "loss" in validation and not math.isfinite(validation["loss"]):
        return "the pick's validation loss is non-finite"
    return ""


def _paired_speed(points: list[Checkpoint],
                  noise: PooledNoise | None) -> SpeedupEstimate | None:
    """The pick's speedup over the stretches that timed steps on both sides (None: under 2)."""
    ratios = round_log_ratios([p.float32_steps_ms for p in points],
                              [p.pick_steps_ms for p in points])
    return speedup_from_log_ratios(ratios, noise) if len(ratios) >= 2 else None


def _speed_gap(speed: SpeedupEstimate | None, chosen_on: SpeedupEstimate | None,
               min_gain: float | None) -> str:
    """Why the pick's speed did not hold over the fresh stretches ("" when it did, when it
    could not be re-checked, the rounds' figure then standing, and the line saying so, or when
    speed was not what chose it: ``min_gain`` None)."""
    if speed is None or min_gain is None or speed.clears(1.0 + min_gain):
        return ""
    rounds = f" (the rounds it was chosen on: {chosen_on.describe()})" if chosen_on else ""
    return (f"its speed did not hold: {speed.describe()} vs float32 over {speed.rounds} fresh "
            f"stretches timed back to back{rounds}, not clear of float32 + {min_gain:.0%}")


def _final_gap(outcome: Confirmation) -> str:
    """Why the pick ends worse than float32 ("" when it does not): on validation, or, where the
    model cannot be evaluated, on the training losses of the last stretch (same batches, same
    order for both; the noise is float32's step-to-step scatter there), each loss on its own
    where the model returns several; and on the task's ``val_metric`` where it has one."""
    last = outcome.checkpoints[-1]
    error = last.float32.get("error", "?")
    if "loss" in last.float32 and "loss" in last.pick:
        gap = validation_gap(last.pick, last.float32)
    elif last.float32_terms:
        outcome.fallback = (f"the model cannot be evaluated ({error}): each of its losses "
                            "compared over the last stretch")
        gap = stretch_terms_gap(outcome.checkpoints[0].float32_terms, last.float32_terms,
                                last.pick_terms)
    elif not last.float32_losses or not last.pick_losses:
        gap = "" if "val_metric" in last.float32 else \
            "neither validation nor training losses to compare"
    else:
        outcome.fallback = (f"the model cannot be evaluated ({error}): compared on the "
                            "training losses of the last stretch")
        noise = NOISE_SIGMAS * standard_error(last.float32_losses)
        gap = level_gap("training loss over the last stretch",
                        statistics.fmean(last.pick_losses),
                        statistics.fmean(last.float32_losses), noise, LEVEL_ALLOWANCE)
    gap = gap or metric_gap(last.pick, last.float32)
    return f"at step {last.step}, {gap}" if gap else ""


def confirm_pick(outcome, confirmer: Confirmer, baseline, candidates: list, rows: dict, *,
                 min_gain: float, rounds: int, choose=None, max_attempts: int = MAX_ATTEMPTS):
    """Confirm ``outcome``'s pick (a ``tuner.run.remeasure.Remeasured``); while one fails, the
    decision is taken again without it (``candidates``: the re-measured finalists; ``choose``:
    the objective's choice among those left, a ``Decision``; by default the speed decision),
    at most ``max_attempts`` configs, else float32 (``baseline``). Returns ``outcome``,
    updated."""
    outcome.confirm_skipped = not confirmer.budget.enabled
    rejected: list[str] = []
    while outcome.winner is not baseline:
        confirmation = confirmer.confirm(baseline, outcome.winner)
        outcome.confirmations.append(confirmation)
        if confirmation.passed:
            speed = confirmation.speed     # the fresh figure, not the selection's, when timed
            held = "held over fresh runs: " if speed else ""
            outcome.decision = dataclasses.replace(
                outcome.decision, estimate=speed or outcome.decision.estimate,
                explanation=f"{outcome.decision.explanation}; {held}"
                            f"{confirmation.speed_text()}")
            return outcome
        what = "confirmation" if confirmation.quality else "speed check"
        rejected.append(f"#{confirmation.trial} failed its {what} ({confirmation.reason})")
        tried = {done.trial for done in outcome.confirmations}
        left = [c for c in candidates if c.number not in tried] \
            if len(outcome.confirmations) < max_attempts else []
        decision = choose(left) if choose is not None and left else decide(
            baseline.number, left, min_gain=min_gain, baseline_rounds=rounds,
            run_drift=confirmer.run_drift)
        then = f"then: {decision.explanation}" if left else \
            "no other finalist left to confirm: float32"
        outcome.decision = dataclasses.replace(
            decision, explanation="; ".join(rejected) + "; " + then)
        outcome.winner = rows[decision.winner]
    baseline.estimate = SpeedupEstimate.identity(rounds)
    return outcome
