"""The driver: Optuna ask/tell over a search space, trials on an executor, MLflow records.

Only this process writes the Optuna storage and MLflow. Order of work:
float32 baseline -> recommended configs -> Optuna's choices -> re-measure the top stable
candidates back to back -> best config. The objective is the median step time (minimised);
stability is an Optuna constraint, so ``study.best_trial`` is the fastest stable trial.
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.config import PrecisionConfig
from tuner.errors import TunerError
from tuner.space import SearchSpace
from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec
from tuner.verdict import Judgement, Verdict, judge

UNSTABLE = 1.0  # Optuna constraint value of an unstable trial (feasible is <= 0)
_MAX_DUPLICATE_ASKS = 50


@dataclass
class TuneOptions:
    task_path: Path
    space: SearchSpace
    run_dir: Path
    trials: int | None = None             # default: the space's `trials`
    steps: int | None = None              # default: the space's trial.steps
    seed: int = 0
    min_loss_decrease_ratio: float | None = None  # default: the space's value
    tracking_uri: str | None = None       # default: SQLite in the run directory
    slow_factor: float = 1.5              # stop a trial this much slower than the best stable
    finalists: int = 3                    # stable candidates re-measured back to back
    remeasure_rounds: int = 2
    trial_time_limit_s: float = 900.0

    @property
    def budget_steps(self) -> int:
        return self.steps or self.space.budget.steps

    @property
    def tolerance(self) -> float:
        return self.min_loss_decrease_ratio or self.space.budget.min_loss_decrease_ratio


@dataclass
class TrialRow:
    number: int
    config: PrecisionConfig
    result: TrialResult
    judgement: Judgement
    run_id: str | None = None
    remeasured_ms: float | None = None


@dataclass
class TuneSummary:
    rows: list[TrialRow]
    best: TrialRow | None
    baseline: TrialRow | None
    speedup: float | None               # float32 median / best median, re-measured
    wall_s: float
    train_s: float                      # time inside training steps, all trials + re-measure
    run_dir: Path
    parent_run_id: str | None
    tracking_uri: str
    space_exhausted: bool = False
    task_info: dict[str, Any] = field(default_factory=dict)
    best_config: PrecisionConfig | None = None   # the winner, with provenance

    @property
    def outside_training_fraction(self) -> float:
        return max(0.0, 1.0 - self.train_s / self.wall_s) if self.wall_s else 0.0


class Progress(Protocol):
    def trial_started(self, number: int, description: str) -> None: ...
    def trial_finished(self, row: TrialRow, best: TrialRow | None, speedup: float | None) -> None: ...
    def phase(self, text: str) -> None: ...


class _NoProgress:
    def trial_started(self, number: int, description: str) -> None:
        pass

    def trial_finished(self, row: TrialRow, best: TrialRow | None, speedup: float | None) -> None:
        pass

    def phase(self, text: str) -> None:
        pass


def _config_key(config: PrecisionConfig) -> str:
    data = config.to_dict()
    data.pop("provenance", None)
    return json.dumps(data, sort_keys=True)


class Search:
    def __init__(self, options: TuneOptions, executor, progress: Progress | None = None,
                 task_info: dict[str, Any] | None = None) -> None:
        self.options = options
        self.space = options.space
        self.executor = executor
        self.progress = progress or _NoProgress()
        self.task_info = task_info or {}
        self.rows: list[TrialRow] = []
        self._by_key: dict[str, TrialRow] = {}
        self.train_s = 0.0
        self.shared_remeasure = False  # True when no node could be reserved for re-measuring

    # -- bookkeeping -----------------------------------------------------------------------
    @property
    def baseline(self) -> TrialRow | None:
        return self.rows[0] if self.rows else None  # trial 0 always finishes first, alone

    def best_stable(self) -> TrialRow | None:
        stable = [r for r in self.rows if r.judgement.stable and r.judgement.median_step_ms]
        return min(stable, key=lambda r: r.judgement.median_step_ms) if stable else None

    def _speedup(self, row: TrialRow | None) -> float | None:
        base = self.baseline
        if row is None or base is None or not base.judgement.median_step_ms \
                or not row.judgement.median_step_ms:
            return None
        return base.judgement.median_step_ms / row.judgement.median_step_ms

    def _judge(self, result: TrialResult) -> Judgement:
        budget = self.space.budget
        return judge(result, self.baseline.result if self.baseline else None,
                     floor=self.space.loss_scale_floor,
                     max_skipped_fraction=budget.max_skipped_fraction,
                     min_loss_decrease_ratio=self.options.tolerance,
                     expected_steps=self.options.budget_steps)

    def _spec(self, number: int, config: PrecisionConfig, *, purpose: str = "search",
              stop_if_slower_than_ms: float | None = None) -> TrialSpec:
        return TrialSpec(number=number, task_path=str(self.options.task_path),
                         config=config.to_dict(), steps=self.options.budget_steps,
                         warmup_steps=self.space.budget.warmup_steps, seed=self.options.seed,
                         stop_if_slower_than_ms=stop_if_slower_than_ms, purpose=purpose)

    def _account(self, result: TrialResult) -> TrialResult:
        self.train_s += result.train_s
        return result

    # -- the search ------------------------------------------------------------------------
    def run(self, study, tracker) -> bool:
        """Run trials until the budget is spent; return True when the space ran out first.

        The float32 baseline runs first and alone (every verdict and the early-stop limit
        need it); after that up to ``executor.slots`` trials run side by side.
        """
        trials = self.options.trials or self.space.trials
        distinct = self.space.size()
        study.enqueue_trial(self.space.baseline_params())
        for params in self.space.recommended_params():
            study.enqueue_trial(params)
        pending: dict[int, tuple[Any, PrecisionConfig, str]] = {}
        waiting: dict[str, list] = {}      # Optuna trials that duplicate a pending one
        submitted = duplicates = 0
        exhausted = False
        while True:
            capacity = 1 if not self.rows else self.executor.slots
            while (self.executor.in_flight() < capacity and submitted < trials
                   and not exhausted):
                if len(self._by_key) + len(pending) >= distinct:
                    exhausted = True
                    break
                trial = study.ask()
                config = self.space.suggest(trial)
                key = _config_key(config)
                if key in self._by_key or key in waiting:
                    # Optuna proposed a config we already measured (or are measuring).
                    if key in self._by_key:
                        self._tell(study, trial, self._by_key[key])
                    else:
                        waiting[key].append(trial)
                    duplicates += 1
                    exhausted = duplicates > _MAX_DUPLICATE_ASKS
                    continue
                if submitted == 0 and config.policy != "float32":
                    raise TunerError("internal error: the first trial must be the float32 "
                                     "baseline")
                number = submitted  # our numbering; Optuna's skips answered duplicates
                submitted += 1
                best = self.best_stable()
                threshold = (self.options.slow_factor * best.judgement.median_step_ms
                             if best is not None and best.judgement.median_step_ms else None)
                self.progress.trial_started(number, config.describe())
                self.executor.submit(self._spec(number, config, stop_if_slower_than_ms=threshold),
                                     self.options.trial_time_limit_s)
                pending[number] = (trial, config, key)
                waiting[key] = []
            if not pending:
                return exhausted and submitted < trials
            for result in self.executor.wait_any():
                trial, config, key = pending.pop(result.number)
                self._finish(study, tracker, trial, config, key, self._account(result),
                             waiting.pop(key, []))

    def _finish(self, study, tracker, trial, config: PrecisionConfig, key: str,
                result: TrialResult, duplicates: list) -> None:
        import optuna

        row = TrialRow(result.number, config, result, self._judge(result))
        if not self.rows and not row.judgement.stable:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise TunerError(f"the float32 baseline trial did not train stably "
                             f"({row.judgement.reason}); nothing can be judged against it. "
                             "Check the task with plain float32 training first.")
        self.rows.append(row)
        self._by_key[key] = row
        self._tell(study, trial, row)
        for duplicate in duplicates:
            self._tell(study, duplicate, row)
        row.run_id = tracker.log_trial(
            config=config, result=result, judgement=row.judgement,
            baseline_ms=self.baseline.judgement.median_step_ms, optuna_number=trial.number)
        best = self.best_stable()
        self.progress.trial_finished(row, best, self._speedup(best))

    @staticmethod
    def _tell(study, trial, row: TrialRow) -> None:
        from optuna.trial import TrialState

        verdict = row.judgement.verdict
        median = row.judgement.median_step_ms
        if median is None and row.result.step_times_ms:
            median = statistics.median(row.result.step_times_ms)
        trial.set_user_attr("verdict", verdict.value)
        trial.set_user_attr("reason", row.judgement.reason)
        if verdict is Verdict.FAILED or median is None:
            study.tell(trial, state=TrialState.FAIL)
        elif verdict is Verdict.STOPPED_SLOW:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            trial.set_constraint("unstable", 0.0 if row.judgement.stable else UNSTABLE)
            study.tell(trial, median)

    # -- re-measure ------------------------------------------------------------------------
    def remeasure(self) -> tuple[TrialRow | None, float | None]:
        """Re-time the top stable candidates and float32 back to back; pick the fastest."""
        baseline = self.baseline
        stable = sorted((r for r in self.rows[1:] if r.judgement.stable
                         and r.judgement.median_step_ms),
                        key=lambda r: r.judgement.median_step_ms)[:self.options.finalists]
        if baseline is None:
            return None, None
        candidates = [baseline] + stable
        if len(candidates) == 1:
            baseline.remeasured_ms = baseline.judgement.median_step_ms
            return baseline, 1.0
        self.progress.phase(f"re-measuring {len(candidates)} finalists back to back "
                            f"({self.options.remeasure_rounds} rounds)")
        timings: dict[int, list[float]] = {row.number: [] for row in candidates}
        failed: set[int] = set()
        # Interleaved rounds, so that drift in machine speed hits every candidate alike, on a
        # worker that has its node to itself.
        specs = [self._spec(row.number, row.config, purpose="remeasure")
                 for _ in range(self.options.remeasure_rounds) for row in candidates]
        for result in self.executor.run_exclusive(specs, self.options.trial_time_limit_s):
            self._account(result)
            if not self._judge(result).stable:
                failed.add(result.number)
            if not result.exclusive_timing:
                self.shared_remeasure = True
            timings[result.number].extend(result.timed_steps_ms)
        for row in candidates:
            if timings[row.number]:
                row.remeasured_ms = statistics.median(timings[row.number])
        finalists = [r for r in candidates if r.number not in failed and r.remeasured_ms]
        if baseline not in finalists or not baseline.remeasured_ms:
            raise TunerError("re-measuring the float32 baseline failed; cannot name a winner. "
                             "Is the machine overloaded or out of memory?")
        winner = min(finalists, key=lambda r: r.remeasured_ms)
        return winner, baseline.remeasured_ms / winner.remeasured_ms


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu} ({platform.system()} {platform.machine()})"


def provenance(summary_best: TrialRow, speedup: float | None, options: TuneOptions,
               task_info: dict[str, Any]) -> dict[str, Any]:
    return {
        "task": options.task_path.name,
        "tuned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "trial": summary_best.number,
        "median_step_ms": round(summary_best.remeasured_ms or 0.0, 4),
        "speedup_vs_float32": round(speedup, 4) if speedup else None,
        "machine": machine_description(),
        "tensorflow": task_info.get("tensorflow", "?"),
        "keras": task_info.get("keras", "?"),
    }


def create_study(run_dir: Path, study_name: str, seed: int):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{(run_dir / 'optuna.db').resolve()}"
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    return optuna.create_study(study_name=study_name, storage=storage, direction="minimize",
                               sampler=sampler, load_if_exists=False)


def tune(options: TuneOptions, executor, progress: Progress | None = None,
         task_info: dict[str, Any] | None = None, started: float | None = None) -> TuneSummary:
    """Run a whole tuning job; the caller has validated input and created ``run_dir``.

    ``started`` (a ``time.perf_counter()`` value) lets the caller include its own start-up
    (worker start, task check) in the reported wall time.
    """
    from tuner.report import summary_markdown
    from tuner.tracking import Tracker, default_tracking_uri

    started = time.perf_counter() if started is None else started
    run_dir = options.run_dir
    tracking_uri = options.tracking_uri or default_tracking_uri(run_dir)
    task_name = options.task_path.stem
    tracker = Tracker(tracking_uri, run_dir, f"precision-tuner/{task_name}")
    study = create_study(run_dir, f"{task_name}-{run_dir.name}", options.seed)
    tracker.start_parent(
        f"tune {task_name} · {options.space.name}",
        params={"task": str(options.task_path), "space": options.space.name,
                "trials": options.trials or options.space.trials,
                "steps": options.budget_steps, "seed": options.seed,
                "min_loss_decrease_ratio": options.tolerance,
                "slow_factor": options.slow_factor, "finalists": options.finalists},
        tags={"run_dir": str(run_dir.resolve()), "machine": machine_description()})
    search = Search(options, executor, progress, task_info)
    status = "FAILED"
    best = speedup = None
    exhausted = False
    try:
        exhausted = search.run(study, tracker)
        best, speedup = search.remeasure()
        for row in search.rows:
            if row.remeasured_ms is not None and row.run_id:
                tracker.log_remeasure(row.run_id, row.remeasured_ms,
                                      search.baseline.remeasured_ms / row.remeasured_ms
                                      if search.baseline and search.baseline.remeasured_ms
                                      else None)
        status = "FINISHED"
    finally:
        best_config = None
        if best is not None:
            best_config = PrecisionConfig.from_dict(
                {**best.config.to_dict(),
                 "provenance": provenance(best, speedup, options, search.task_info)})
            best_config.save(run_dir / "best_precision.json", overwrite=True)
        wall_s = time.perf_counter() - started
        summary = TuneSummary(rows=sorted(search.rows, key=lambda r: r.number), best=best, baseline=search.baseline,
                              speedup=speedup, wall_s=wall_s, train_s=search.train_s,
                              run_dir=run_dir, parent_run_id=tracker.parent_id,
                              tracking_uri=tracking_uri,
                              space_exhausted=status == "FINISHED" and exhausted,
                              task_info=search.task_info, best_config=best_config)
        _save_trials(run_dir, search.rows)
        tracker.finish_parent(
            metrics={k: v for k, v in {
                "best_speedup_vs_float32": speedup,
                "best_median_step_ms": best.remeasured_ms if best else None,
                "float32_median_step_ms": search.baseline.remeasured_ms
                if search.baseline else None,
                "trials": float(len(search.rows)),
                "stable_trials": float(sum(r.judgement.stable for r in search.rows)),
                "wall_s": wall_s, "train_s": search.train_s,
                "outside_training_fraction": summary.outside_training_fraction,
            }.items() if v is not None},
            best=best_config, summary_markdown=summary_markdown(summary), status=status)
    return summary


def _save_trials(run_dir: Path, rows: list[TrialRow]) -> None:
    """Plain-data record of every trial, next to the stores (used by `export`)."""
    records = [{"number": r.number, "config": r.config.to_dict(), "result": r.result.to_dict(),
                "verdict": r.judgement.verdict.value, "reason": r.judgement.reason,
                "loss_decrease_ratio": r.judgement.loss_decrease_ratio,
                "median_step_ms": r.judgement.median_step_ms,
                "remeasured_ms": r.remeasured_ms} for r in rows]
    tmp = run_dir / ".trials.json.tmp"
    tmp.write_text(json.dumps(records, indent=1, default=str))
    tmp.replace(run_dir / "trials.json")
