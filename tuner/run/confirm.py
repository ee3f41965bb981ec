"""The confirmation run: does the pick train as well as float32 over a longer run?

A search trial is short (tens to hundreds of steps), and a config can pass it and still train
to a worse model: a plateau that float32 passes later, rounding that only matters once the
loss is small. So before a 16-bit pick is exported, it and float32 train on, side by side, on
their live models in the re-measurement's exclusive worker (``tuner.worker.live``), for a
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

Pure driver code: the runs go through the executor's exclusive session; no TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tuner.judging.decision import decide
from tuner.judging.noise import SpeedupEstimate
from tuner.trial_types import TrialOutcome, TrialResult
from tuner.judging.verdict import (LEVEL_ALLOWANCE, NOISE_SIGMAS, level_gap, standard_error,
                                   validation_gap)

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


@dataclass
class Checkpoint:
    step: int                        # steps each model has trained in all
    float32: dict[str, Any]          # tuner.worker.validation results
    pick: dict[str, Any]
    # The training losses of the steps since the last checkpoint: what is compared when the
    # model cannot be evaluated (``model.evaluate`` fails, or its test_step reports no loss).
    float32_losses: list[float] = field(default_factory=list)
    pick_losses: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def brief(validation: dict[str, Any]) -> dict[str, Any]:
            return {key: validation.get(key) for key in ("loss", "metrics", "error")
                    if validation.get(key) is not None}

        return {"step": self.step, "float32": brief(self.float32), "pick": brief(self.pick)}


@dataclass
class Confirmation:
    trial: int                       # the confirmed config's trial number
    config: str                      # its description
    passed: bool
    reason: str                      # why it was rejected ("" when it passed)
    steps: int = 0                   # steps trained past the search, per model
    why_steps: str = ""
    checkpoints: list[Checkpoint] = field(default_factory=list)
    noise: float | None = None       # float32's validation noise at the end (+-, 2 s.e.)
    allowance: float = LEVEL_ALLOWANCE
    seconds: float = 0.0
    fallback: str = ""               # what was compared instead of validation, and why

    def to_dict(self) -> dict[str, Any]:
        last = self.checkpoints[-1] if self.checkpoints else None
        return {"trial": self.trial, "config": self.config,
                "verdict": "passed" if self.passed else "rejected", "reason": self.reason,
                "steps": self.steps, "why_steps": self.why_steps,
                "final_step": last.step if last else None,
                "float32_val_loss": last.float32.get("loss") if last else None,
                "pick_val_loss": last.pick.get("loss") if last else None,
                "noise": self.noise, "allowance": self.allowance,
                "checkpoints": [c.to_dict() for c in self.checkpoints],
                "compared_on": self.fallback or "validation",
                "seconds": round(self.seconds, 3)}

    def table(self) -> list[str]:
        """``step  float32 val  pick val`` lines for the summary (training losses of each
        stretch, marked, where the model cannot be evaluated)."""
        what = "train loss" if self.fallback else "val loss"
        lines = [f"  {'step':>6}  {'float32 ' + what:>18}  {'#' + str(self.trial) + ' ' + what:>16}"]
        for point in self.checkpoints:
            base, mine = (_mean(point.float32_losses), _mean(point.pick_losses)) \
                if self.fallback else (_loss(point.float32), _loss(point.pick))
            lines.append(f"  {point.step:>6}  {base:>18}  {mine:>16}")
        return lines

    def line(self) -> str:
        last = self.checkpoints[-1] if self.checkpoints else None
        if not self.passed or last is None:
            return f"rejected #{self.trial} ({self.config}) in the confirmation: {self.reason}"
        if self.fallback:
            figures = (f"training loss {_mean(last.pick_losses)} vs float32's "
                       f"{_mean(last.float32_losses)} over the steps to {last.step} "
                       f"({self.fallback})")
        else:
            figures = (f"validation loss {_loss(last.pick)} vs float32's {_loss(last.float32)} "
                       f"at step {last.step}")
        return (f"confirmed #{self.trial} ({self.config}) over {self.steps} more steps "
                f"({self.why_steps}): {figures} (noise +-{self.noise or 0:.2g}, allowance "
                f"{self.allowance:.0%})")


def _mean(losses: list[float]) -> str:
    return f"{statistics.fmean(losses):.4g}" if losses else "-"


def _loss(validation: dict[str, Any]) -> str:
    loss = validation.get("loss")
    return "-" if loss is None else f"{loss:.4g}"


class Confirmer:
    """Runs the confirmation of a config against float32. ``run(row, train_to)`` trains the
    row's live model until it has trained ``train_to`` steps in all, then validates it (a
    ``TrialSpec`` with ``train_to`` and ``validate`` on the exclusive session)."""

    def __init__(self, run: Callable[[Any, int], TrialResult], budget: ConfirmBudget,
                 trial_steps: int, progress) -> None:
        self.run = run
        self.budget = budget
        self.trial_steps = trial_steps
        self.progress = progress

    def confirm(self, baseline, pick) -> Confirmation:
        started = time.perf_counter()
        run = self.run
        both_ms = (baseline.remeasured_ms or baseline.judgement.median_step_ms or 0.0) + \
            (pick.remeasured_ms or pick.judgement.median_step_ms or 0.0)
        extra, why = self.budget.extra_steps(self.trial_steps, both_ms)
        outcome = Confirmation(pick.number, pick.config.describe(), False, "", extra, why)
        self.progress.phase(
            f"confirming #{pick.number} ({pick.config.describe()}) against float32: "
            f"{extra} more steps each, validated at {CHECKPOINTS} points")
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
            outcome.checkpoints.append(Checkpoint(
                target, results[id(baseline)].validation or {}, results[id(pick)].validation or {},
                results[id(baseline)].losses, results[id(pick)].losses))
        return self._end(outcome, _final_gap(outcome), started)

    @staticmethod
    def _end(outcome: Confirmation, problem: str, started: float) -> Confirmation:
        outcome.passed, outcome.reason = not problem, problem
        if outcome.checkpoints:
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


def _final_gap(outcome: Confirmation) -> str:
    """Why the pick ends worse than float32 ("" when it does not): on validation, or, where the
    model cannot be evaluated, on the training losses of the last stretch (same batches, same
    order for both; the noise is float32's step-to-step scatter there)."""
    last = outcome.checkpoints[-1]
    if "loss" in last.float32 and "loss" in last.pick:
        gap = validation_gap(last.pick, last.float32)
        return f"at step {last.step}, {gap}" if gap else ""
    if not last.float32_losses or not last.pick_losses:
        return f"at step {last.step}, neither validation nor training losses to compare"
    outcome.fallback = (f"the model cannot be evaluated ({last.float32.get('error', '?')}): "
                        "compared on the training losses of the last stretch")
    noise = NOISE_SIGMAS * standard_error(last.float32_losses)
    gap = level_gap("training loss over the last stretch", statistics.fmean(last.pick_losses),
                    statistics.fmean(last.float32_losses), noise, LEVEL_ALLOWANCE)
    return f"at step {last.step}, {gap}" if gap else ""


def confirm_pick(outcome, confirmer: Confirmer, baseline, candidates: list, rows: dict, *,
                 min_gain: float, rounds: int):
    """Confirm ``outcome``'s pick (a ``tuner.run.remeasure.Remeasured``); while one fails, the
    decision is taken again without it (``candidates``: the re-measured finalists), at most
    ``MAX_ATTEMPTS`` configs, else float32 (``baseline``). Returns ``outcome``, updated."""
    if outcome.winner is baseline or not confirmer.budget.enabled:
        outcome.confirm_skipped = not confirmer.budget.enabled
        return outcome
    rejected: list[str] = []
    while outcome.winner is not baseline:
        confirmation = confirmer.confirm(baseline, outcome.winner)
        outcome.confirmations.append(confirmation)
        if confirmation.passed:
            return outcome
        rejected.append(f"#{confirmation.trial} failed its confirmation "
                        f"({confirmation.reason})")
        tried = {done.trial for done in outcome.confirmations}
        left = [c for c in candidates if c.number not in tried] \
            if len(outcome.confirmations) < MAX_ATTEMPTS else []
        decision = decide(baseline.number, left, min_gain=min_gain, baseline_rounds=rounds)
        then = f"then: {decision.explanation}" if left else \
            "no other finalist left to confirm: float32"
        outcome.decision = dataclasses.replace(
            decision, explanation="; ".join(rejected) + "; " + then)
        outcome.winner = rows[decision.winner]
    baseline.estimate = SpeedupEstimate.identity(rounds)
    return outcome
