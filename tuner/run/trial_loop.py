"""Where a trial is scheduled: proposals become specs on an executor, results become rows.

The float32 baseline runs first and alone (every verdict and the early-stop limit need it);
after that up to ``executor.slots`` trials run side by side. Each finished trial is judged
against the baseline, recorded (``TrialRecords``: MLflow and the run directory) and told to the
proposer. Choosing configs is the proposer's job, re-timing the finalists ``tuner.run.remeasure``'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from tuner import interrupt
from tuner.apply.config import PrecisionConfig, compute_dtype_of
from tuner.errors import TunerError
from tuner.execution.base import Executor
from tuner.judging.decision import no_loss_scale_evidence
from tuner.judging.underflow import trained_scale, underflow_note
from tuner.judging.verdict import Judgement, judge
from tuner.judging.worth_training import HoldKind, hold_for, needs_no_more_memory
from tuner.records.results import NoProgress, Progress, TrialRow
from tuner.records.timing import TimeBreakdown
from tuner.run.held import HeldConfigs
from tuner.run.kept_models import KeptModels
from tuner.run.plan import RunPlan
from tuner.search.proposer import Proposal, Proposer
from tuner.search.space import MIN_TIMED_STEPS
from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec

# The early-stop limit is ``slow_factor`` times the best stable median. A median taken while
# another trial shared the node is noisier and biased upwards: widen the limit by this much.
SHARED_TIMING_WIDENING = 1.5


class TrialRecords(Protocol):
    """Where finished trials are written (MLflow child runs, the run directory)."""

    def trial_started(self, number: int, config: PrecisionConfig,
                      optuna_number: int | None, repair: bool) -> None: ...
    def trial_finished(self, row: TrialRow, baseline_ms: float | None) -> None: ...
    def steps_sized(self, steps: int, why: str) -> None: ...
    def live_models_released(self, event: dict[str, Any]) -> None: ...


def make_spec(plan: RunPlan, number: int, config: PrecisionConfig,
              stop_if_slower_than_ms: float | None = None) -> TrialSpec:
    return TrialSpec(number=number, task_path=str(plan.task_path), config=config.to_dict(),
                     steps=plan.steps, warmup_steps=plan.warmup_steps, seed=plan.seed,
                     stop_if_slower_than_ms=stop_if_slower_than_ms,
                     time_bound_s=plan.learned.time_bound_s if number else None,
                     time_bound_min_steps=plan.warmup_steps + MIN_TIMED_STEPS,
                     integer_inputs=[dict(entry) for entry in plan.learned.integer_inputs],
                     continuous_inputs=[dict(entry) for entry in plan.learned.continuous_inputs],
                     batch_pool=plan.learned.batch_pool, strict_float32=plan.strict_float32)


class Scheduler:
    def __init__(self, plan: RunPlan, executor: Executor, proposer: Proposer,
                 records: TrialRecords, progress: Progress | None = None,
                 clock: TimeBreakdown | None = None) -> None:
        self.plan = plan
        self.executor = executor
        self.proposer = proposer
        self.records = records
        self.progress = progress or NoProgress()
        self.clock = clock or TimeBreakdown()
        self.rows: list[TrialRow] = []
        self.pending: dict[int, Proposal] = {}
        self.train_s = 0.0
        self.trace_s = 0.0
        self._budget_used = 0
        # The trials whose models the worker keeps alive for the re-measurement.
        self.kept = KeptModels(executor, plan.finalists, plan.worker_memory, records,
                               self.progress)
        # Proposals not trained, or not yet (tuner.judging.worth_training).
        self.held = HeldConfigs(dict(plan.learned.emulated), plan.learned.ceiling_device,
                                plan.finalists)

    # -- bookkeeping -----------------------------------------------------------------------
    @property
    def baseline(self) -> TrialRow | None:
        return self.rows[0] if self.rows else None  # trial 0 always finishes first, alone

    def timed_stable_rows(self) -> list[TrialRow]:
        """Stable trials with a step time, fastest (search-phase median) first."""
        stable = [r for r in self.rows if r.judgement.stable and r.judgement.median_step_ms]
        return sorted(stable, key=lambda r: r.judgement.median_step_ms)

    def ranked_stable_rows(self) -> list[TrialRow]:
        """The stable trials an objective of memory can rank: with a memory figure and, for
        float16 without a loss scale, the diagnostics' evidence that it needs none."""
        allowed, _ = no_loss_scale_evidence(self.plan.learned.gradient_p01)
        return [r for r in self.timed_stable_rows() if r.result.training_memory
                and (allowed or not r.config.float16_without_loss_scale)]

    def best_stable(self) -> TrialRow | None:
        stable = self.timed_stable_rows()
        return stable[0] if stable else None

    def search_speedup(self, row: TrialRow | None) -> float | None:
        """Screening figure only (search-phase medians); the decision uses re-measurements."""
        base = self.baseline
        if row is None or base is None or not base.judgement.median_step_ms \
                or not row.judgement.median_step_ms:
            return None
        return base.judgement.median_step_ms / row.judgement.median_step_ms

    def judge(self, result: TrialResult, config: PrecisionConfig) -> Judgement:
        budget = self.plan.space.budget
        judgement = judge(result, self.baseline.result if self.baseline else None,
                          floor=self.plan.space.loss_scale_floor,
                          max_skipped_fraction=budget.max_skipped_fraction,
                          min_loss_decrease_ratio=self.plan.tolerance,
                          expected_steps=self.plan.steps)
        if judgement.shortfall and compute_dtype_of(config.policy) == "float16" \
                and self.plan.learned.gradient_histograms:
            # A float16 trial that learned too little: name the layers whose gradients
            # vanish at the scale it trained at, from the diagnostics' histograms.
            note = underflow_note(self.plan.learned.gradient_histograms,
                                  trained_scale(result, config))
            if note:
                judgement = dataclasses.replace(judgement, reason=f"{judgement.reason}; {note}")
        return judgement

    def account(self, result: TrialResult, phase: str = "trials") -> TrialResult:
        """Count a run's time: in the totals and in ``phase``'s worker time."""
        self.train_s += result.train_s
        self.trace_s += result.trace_s
        self.clock.workers[phase].add(result)
        return result

    def stop_limit_ms(self, config: PrecisionConfig | None = None) -> float | None:
        """Early-stop limit for a trial of ``config``: from exclusive timings where there are
        some. It serves the objective: under ``memory`` no trial is stopped for speed; under
        ``balanced`` only against stable configs that need no more memory than ``config``
        (``needs_no_more_memory``: one of them faster dominates it). None with
        --keep-slow-policies: policies kept although they cannot win on speed are there to be
        judged on stability, which a trial stopped as slow leaves unknown."""
        if self.plan.keep_slow_policies or not self.plan.objective.stops_slow_trials:
            return None
        stable = self.timed_stable_rows()
        if self.plan.objective.stops_only_when_dominated:
            stable = [r for r in stable
                      if config is not None and needs_no_more_memory(r.config, config)]
        exclusive = [r.judgement.median_step_ms for r in stable if r.result.exclusive_timing]
        if exclusive:
            return self.plan.slow_factor * min(exclusive)
        if stable:
            return self.plan.slow_factor * SHARED_TIMING_WIDENING * \
                min(r.judgement.median_step_ms for r in stable)
        return None

    # -- resuming --------------------------------------------------------------------------
    def restore(self, records: list[dict[str, Any]]) -> None:
        """Take back the trials an earlier, interrupted process finished."""
        for record in sorted(records, key=lambda r: r["number"]):
            config = PrecisionConfig.from_dict(record["config"])
            result = TrialResult.from_dict(record["result"])
            row = TrialRow(result.number, config, result, self.judge(result, config),
                           record.get("run_id"), record.get("optuna_number"),
                           bool(record.get("repair")))
            self.rows.append(row)
            self.proposer.restore(self.proposer.key(config), row.number,
                                  from_space=not row.repair)
            self._budget_used += not (self.plan.exhaustive and row.repair)
        if self.rows and (self.rows[0].number != 0 or self.rows[0].config.policy != "float32"):
            raise TunerError("the run directory's trials.jsonl does not start with the float32 "
                             "baseline; it cannot be resumed. Start a new --run-dir.")
        if self.rows and self.plan.learned.sizing is not None:  # killed before run.json said so
            self._size(self.rows[0].result)
        if self.rows:
            self.plan = self.plan.time_bounded(self.rows[0].result.train_s)

    # -- the search ------------------------------------------------------------------------
    def run(self) -> bool:
        """Run trials until the budget is spent; return True when the space ran out first.
        Then the deferred proposals come back once (``HeldConfigs.release``)."""
        number = max((r.number for r in self.rows), default=-1) + 1
        while True:
            capacity = 1 if not self.rows else self.executor.slots
            while self.executor.in_flight() < capacity:
                proposal, released = self._next_proposal()
                if proposal is None:
                    break
                if released:   # beyond the budget the progress bar started with
                    self.held.trained_after.append((number, proposal.config.compute_dtype))
                    self.progress.more(1)
                if not self.rows and not self.pending and proposal.config.policy != "float32":
                    raise TunerError("internal error: the first trial must be the float32 "
                                     "baseline")
                self._submit(number, proposal)
                number += 1
            if not self.pending:
                if self.held.release():
                    self.progress.phase(self.held.released_line())
                    continue
                return self.proposer.exhausted and self._budget_used < self.plan.trials
            for result in self.executor.wait_any():
                if self.kept.retry_fresh(self.account(result)):
                    self.executor.submit(self._spec(result.number, self.pending[result.number]),
                                         self.plan.trial_time_limit_s)
                    continue
                self._finish(self.pending.pop(result.number), result)
            interrupt.raise_if_requested()

    def _next_proposal(self) -> tuple[Proposal | None, bool]:
        """The next proposal worth training now, and whether the search had deferred it: a
        released one, else the proposer's within the budget; those not worth training are
        held (``tuner.judging.worth_training``)."""
        while True:
            proposal = self.held.next_released()
            final = proposal is not None
            if proposal is None and self._may_propose():
                pending_keys = {p.key for p in self.pending.values()} | self.held.waiting_keys
                proposal = self.proposer.next(pending_keys)
            if proposal is None:
                return None, False
            hold = None if proposal.is_repair or not self.rows else hold_for(
                proposal.config, [(r.number, r.config) for r in self.ranked_stable_rows()],
                memory=self.plan.objective.ranks_by_memory, emulated=self.held.emulated,
                finalists=self.plan.finalists, final=final)
            if hold is None:
                return proposal, final
            self.held.hold(proposal, hold)
            if hold.kind is not HoldKind.DEFERRED:
                self.proposer.not_trained(proposal, self.held.reason(hold))

    def _may_propose(self) -> bool:
        """Within the trial budget; under --exhaustive a repair may always run (it is an
        extra try, never one of the grid's configs)."""
        return self._budget_used < self.plan.trials or \
            (self.plan.exhaustive and self.proposer.has_repairs)

    def _submit(self, number: int, proposal: Proposal) -> None:
        # Repairs are extra tries: they never cost the grid a config under --exhaustive.
        self._budget_used += not (self.plan.exhaustive and proposal.is_repair)
        self.pending[number] = proposal
        trial = proposal.optuna_trial
        self.progress.trial_started(number, proposal.config.describe())
        self.records.trial_started(number, proposal.config,
                                   trial.number if trial is not None else None,
                                   proposal.is_repair)
        self.executor.submit(self._spec(number, proposal), self.plan.trial_time_limit_s)

    def _spec(self, number: int, proposal: Proposal) -> TrialSpec:
        spec = make_spec(self.plan, number, proposal.config,
                         self.stop_limit_ms(proposal.config))
        spec.validate = True    # every search trial ends on the run's validation batches
        # The baseline's model stays alive in its worker: the re-measurement starts from it;
        # so may the leading trials' (tuner.run.kept_models).
        spec.keep_live = self.kept.keep(number, self._baseline_result())
        if number == 0 and self.plan.learned.sizing is not None:
            spec.sizing = self.plan.learned.sizing.to_dict()
        return spec

    def _baseline_result(self) -> TrialResult | None:
        return self.baseline.result if self.baseline else None

    def _keep_finalists(self) -> None:
        """Let the worker keep alive only the models the re-measurement may time: float32's
        and the fastest stable trials' (as many as there are finalists)."""
        base = self.baseline
        if base is None:
            return
        leaders = [r for r in self.timed_stable_rows() if r is not base]
        self.kept.keep_finalists(base.result, [make_spec(self.plan, r.number, r.config)
                                               for r in [base, *leaders]])

    def _size(self, baseline: TrialResult) -> None:
        """Every later run trains as many steps as the sized baseline did."""
        steps = max(len(baseline.losses), self.plan.warmup_steps + 1)
        why = baseline.sized_by or f"the floor ({self.plan.learned.sizing.floor} steps)"
        self.plan = self.plan.sized(steps, why)
        self.records.steps_sized(steps, why)
        self.progress.phase(f"steps: every trial trains {steps} steps, as float32 did until {why}")

    def _finish(self, proposal: Proposal, result: TrialResult) -> None:
        trial = proposal.optuna_trial
        if not self.rows and self.plan.learned.sizing is not None and \
                result.outcome is TrialOutcome.COMPLETED:
            self._size(result)
        row = TrialRow(result.number, proposal.config, result,
                       self.judge(result, proposal.config),
                       optuna_number=trial.number if trial is not None else None,
                       repair=proposal.is_repair)
        if not self.rows and row.judgement.stable:
            self.plan = self.plan.time_bounded(result.train_s)
        if not self.rows and not row.judgement.stable:
            self.proposer.fail(proposal)
            self.records.trial_finished(row, row.judgement.median_step_ms)
            raise TunerError(f"the float32 baseline trial did not train stably "
                             f"({row.judgement.reason}); nothing can be judged against it. "
                             "Check the task with plain float32 training first.")
        # First to disk: a kill after this loses nothing.
        self.records.trial_finished(row, (self.baseline or row).judgement.median_step_ms)
        self.rows.append(row)
        self.kept.trial_finished(result, self._baseline_result())
        self.proposer.finished(proposal, row)
        best = self.best_stable()
        self.progress.trial_finished(row, best, self.search_speedup(best))
        if not self.executor.in_flight():
            self._keep_finalists()
