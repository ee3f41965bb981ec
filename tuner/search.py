"""The driver: Optuna ask/tell over a search space, trials on an executor, MLflow records.

Only this process writes the Optuna storage and MLflow. Order of work:
float32 baseline -> recommended configs -> Optuna's choices -> re-measure the top stable
candidates back to back -> best config. The objective is the median step time (minimised);
stability is an Optuna constraint, so ``study.best_trial`` is the fastest stable trial.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.config import Float32Placement, PrecisionConfig
from tuner.errors import TunerError
from tuner.run_store import RunStore, write_atomic
from tuner.space import SearchSpace
from tuner.trial_types import FailureClass, TrialResult, TrialSpec
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
    exhaustive: bool = False              # every config of the space (the grid), no budget

    @property
    def trial_budget(self) -> int:
        return self.space.size() if self.exhaustive else (self.trials or self.space.trials)

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
    shared_remeasure: bool = False      # no node could be reserved for the re-measurement
    trace_s: float = 0.0                # first steps (tracing the training step), likewise

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
                 task_info: dict[str, Any] | None = None, store: RunStore | None = None) -> None:
        self.options = options
        self.store = store
        self.space = options.space
        self.executor = executor
        self.progress = progress or _NoProgress()
        self.task_info = task_info or {}
        self.rows: list[TrialRow] = []
        self._by_key: dict[str, TrialRow] = {}
        self.train_s = 0.0
        self.trace_s = 0.0
        self.shared_remeasure = False  # True when no node could be reserved for re-measuring
        self.requeued: list[dict[str, Any]] = []  # params of trials a kill interrupted
        self.repairs: list[PrecisionConfig] = []  # dtype-mismatch fixes to try next
        self.running_runs: dict[int, str] = {}    # trial number -> its open MLflow run

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
        self.trace_s += result.trace_s
        return result

    # -- resuming --------------------------------------------------------------------------
    def restore(self, records: list[dict[str, Any]]) -> None:
        """Take back the trials an earlier, interrupted process finished."""
        for record in sorted(records, key=lambda r: r["number"]):
            config = PrecisionConfig.from_dict(record["config"])
            result = TrialResult.from_dict(record["result"])
            row = TrialRow(result.number, config, result, self._judge(result), record.get("run_id"))
            self.rows.append(row)
            self._by_key[_config_key(config)] = row
        if self.rows and (self.rows[0].number != 0 or self.rows[0].config.policy != "float32"):
            raise TunerError("the run directory's trials.jsonl does not start with the float32 "
                             "baseline; it cannot be resumed. Start a new --run-dir.")

    def _fixed_queue(self) -> list[dict[str, Any]]:
        """Configs to try before Optuna chooses: baseline, recommended, re-queued, not yet done."""
        queue = [self.space.baseline_params(), *self.space.recommended_params(), *self.requeued]
        if self.options.exhaustive:
            queue += self.space.grid_params()
        done: set[str] = set(self._by_key)
        todo = []
        for params in queue:
            key = _config_key(self.space.config_from_params(params))
            if key not in done:
                done.add(key)
                todo.append(params)
        return todo

    # -- the search ------------------------------------------------------------------------
    def run(self, study, tracker) -> bool:
        """Run trials until the budget is spent; return True when the space ran out first.

        The float32 baseline runs first and alone (every verdict and the early-stop limit
        need it); after that up to ``executor.slots`` trials run side by side. Fixed configs
        are enqueued just before they are asked for, so a resumed study never meets a stale
        queue.
        """
        trials = self.options.trial_budget
        distinct = self.space.size()
        queue = self._fixed_queue()
        pending: dict[int, tuple[Any, PrecisionConfig, str]] = {}
        waiting: dict[str, list] = {}      # Optuna trials that duplicate a pending one
        submitted = len(self.rows)
        duplicates = 0
        exhausted = False
        while True:
            capacity = 1 if not self.rows else self.executor.slots
            while (self.executor.in_flight() < capacity and submitted < trials
                   and not exhausted):
                if self.repairs:
                    # Outside Optuna's space: the failing layer, placed in float32.
                    config = self.repairs.pop(0)
                    key = _config_key(config)
                    if key in self._by_key or key in waiting:
                        continue
                    number = submitted
                    submitted += 1
                    self._submit(tracker, number, config, None, purpose="repair")
                    pending[number] = (None, config, key)
                    waiting[key] = []
                    continue
                if len(self._by_key) + len(pending) >= distinct:
                    exhausted = True
                    break
                if queue:
                    study.enqueue_trial(queue.pop(0))
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
                if not self.rows and not pending and config.policy != "float32":
                    raise TunerError("internal error: the first trial must be the float32 "
                                     "baseline")
                number = submitted  # our numbering; Optuna's skips answered duplicates
                submitted += 1
                self._submit(tracker, number, config, trial.number)
                pending[number] = (trial, config, key)
                waiting[key] = []
            if not pending:
                return exhausted and submitted < trials
            for result in self.executor.wait_any():
                trial, config, key = pending.pop(result.number)
                self._finish(study, tracker, trial, config, key, self._account(result),
                             waiting.pop(key, []))

    def _submit(self, tracker, number: int, config: PrecisionConfig, optuna_number: int | None,
                purpose: str = "search") -> None:
        best = self.best_stable()
        threshold = (self.options.slow_factor * best.judgement.median_step_ms
                     if best is not None and best.judgement.median_step_ms else None)
        self.progress.trial_started(number, config.describe())
        self.running_runs[number] = tracker.start_trial(
            number=number, config=config, optuna_number=optuna_number, purpose=purpose)
        self.executor.submit(self._spec(number, config, stop_if_slower_than_ms=threshold),
                             self.options.trial_time_limit_s)

    def _plan_repair(self, row: TrialRow) -> None:
        """A dtype mismatch that names its layer: try that layer in float32 before giving up."""
        layer = row.result.failure_layer
        if (row.result.failure_class is not FailureClass.DTYPE_MISMATCH or not layer
                or layer in row.config.float32.layers or row.config.policy == "float32"):
            return
        placement = Float32Placement(row.config.float32.groups,
                                     row.config.float32.layers + (layer,))
        repaired = dataclasses.replace(row.config, float32=placement)
        if _config_key(repaired) not in self._by_key:
            self.repairs.append(repaired)

    def _finish(self, study, tracker, trial, config: PrecisionConfig, key: str,
                result: TrialResult, duplicates: list) -> None:
        import optuna

        row = TrialRow(result.number, config, result, self._judge(result))
        if not self.rows and not row.judgement.stable:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            tracker.log_trial(self.running_runs.pop(result.number), config=config,
                              result=result, judgement=row.judgement, baseline_ms=None)
            raise TunerError(f"the float32 baseline trial did not train stably "
                             f"({row.judgement.reason}); nothing can be judged against it. "
                             "Check the task with plain float32 training first.")
        row.run_id = self.running_runs.pop(result.number)
        tracker.log_trial(row.run_id, config=config, result=result, judgement=row.judgement,
                          baseline_ms=(self.baseline or row).judgement.median_step_ms)
        if self.store is not None:  # first to disk: a kill after this line loses nothing
            self.store.append_trial(row_record(row))
        self.rows.append(row)
        self._by_key[key] = row
        if trial is not None:  # repair trials live outside Optuna's space
            self._tell(study, trial, row)
        for duplicate in duplicates:
            self._tell(study, duplicate, row)
        self._plan_repair(row)
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


def recover_study(study) -> list[dict[str, Any]]:
    """Fail the trials a killed process left RUNNING or WAITING; return their params."""
    from optuna.trial import TrialState

    requeue = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
        requeue.append(dict(trial.params))
    for waiting in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        requeue.append(dict(waiting.system_attrs.get("fixed_params", {})))
        study.tell(study.ask(), state=TrialState.FAIL)  # pops the oldest waiting trial
    return [params for params in requeue if params]


def create_study(run_dir: Path, study_name: str, seed: int, *, resume: bool = False):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{(run_dir / 'optuna.db').resolve()}"
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    if resume:
        return optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
    return optuna.create_study(study_name=study_name, storage=storage, direction="minimize",
                               sampler=sampler)


def informed_space(space: SearchSpace, diagnostics: dict[str, Any]) -> SearchSpace:
    """The space with what diagnostics found (riskiest layers, recommended loss scale)."""
    return space.with_diagnostics(diagnostics["candidates"],
                                  diagnostics["loss_scale"]["initial_scale"])


def run_settings(options: TuneOptions, space_ref: str) -> dict[str, Any]:
    """What a run was asked to do, as recorded in run.json (and compared on resume)."""
    return {"task": str(options.task_path), "space": space_ref,
            "trials": options.trial_budget, "steps": options.budget_steps,
            "seed": options.seed, "tolerance": options.tolerance,
            "exhaustive": options.exhaustive}


def tune(options: TuneOptions, executor, progress: Progress | None = None,
         task_info: dict[str, Any] | None = None, started: float | None = None,
         space_ref: str | None = None, diagnostics: dict[str, Any] | None = None) -> TuneSummary:
    """Run (or resume) a whole tuning job; the caller has validated input.

    A run directory that already holds ``run.json`` is resumed: finished trials are kept,
    trials that were running are failed in Optuna, their MLflow runs ended as killed, and
    re-queued. ``started`` (a ``time.perf_counter()`` value) lets the caller include its own
    start-up in the reported wall time.
    """
    from tuner.report import summary_markdown
    from tuner.tracking import Tracker, default_tracking_uri

    started = time.perf_counter() if started is None else started
    run_dir = options.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    store = RunStore(run_dir)
    resume = store.exists
    if diagnostics is not None:
        options.space = informed_space(options.space, diagnostics)
        write_atomic(run_dir / "diagnostics.json", json.dumps(diagnostics, indent=1))
    tracking_uri = options.tracking_uri or default_tracking_uri(run_dir)
    task_name = options.task_path.stem
    tracker = Tracker(tracking_uri, run_dir, f"precision-tuner/{task_name}")
    search = Search(options, executor, progress, task_info, store)
    if resume:
        record = store.read_run()
        study = create_study(run_dir, record["study_name"], options.seed, resume=True)
        search.requeued = recover_study(study)
        tracker.resume_parent(record["parent_run_id"])
        search.restore(store.read_trials())
    else:
        study_name = f"{task_name}-{run_dir.name}"
        study = create_study(run_dir, study_name, options.seed)
        parent_id = tracker.start_parent(
            f"tune {task_name} · {options.space.name}",
            params={**run_settings(options, space_ref or options.space.name),
                    "slow_factor": options.slow_factor, "finalists": options.finalists},
            tags={"run_dir": str(run_dir.resolve()), "machine": machine_description()})
        store.write_run({**run_settings(options, space_ref or options.space.name),
                         "study_name": study_name, "parent_run_id": parent_id,
                         "experiment": f"precision-tuner/{task_name}", "status": "running",
                         "created_at": datetime.datetime.now(datetime.timezone.utc)
                         .isoformat(timespec="seconds")})
    if diagnostics is not None:
        tracker.log_diagnostics(diagnostics)
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
    except KeyboardInterrupt:
        # Ctrl-C: close what is open, leave the study resumable (its RUNNING trials are
        # re-queued by the next `tune` on this run directory), and stop.
        for run_id in search.running_runs.values():
            tracker.kill_trial(run_id, "interrupted (Ctrl-C); re-queued on resume")
        tracker.client.set_terminated(tracker.parent_id, "KILLED")
        store.update_run(status="interrupted")
        raise
    except Exception:
        tracker.client.set_terminated(tracker.parent_id, "FAILED")
        store.update_run(status="failed")
        raise
    best_config = None
    if best is not None:
        best_config = PrecisionConfig.from_dict(
            {**best.config.to_dict(),
             "provenance": provenance(best, speedup, options, search.task_info)})
        best_config.save(run_dir / "best_precision.json", overwrite=True)
    wall_s = time.perf_counter() - started
    rows = sorted(search.rows, key=lambda r: r.number)
    summary = TuneSummary(rows=rows, best=best, baseline=search.baseline, speedup=speedup,
                          wall_s=wall_s, train_s=search.train_s, trace_s=search.trace_s,
                          run_dir=run_dir,
                          parent_run_id=tracker.parent_id, tracking_uri=tracking_uri,
                          space_exhausted=exhausted, task_info=search.task_info,
                          best_config=best_config,
                          shared_remeasure=search.shared_remeasure)
    store.write_trials([row_record(r) for r in rows])
    tracker.log_plots(_make_plots(summary, diagnostics, run_dir / "plots"))
    tracker.finish_parent(
        metrics={k: v for k, v in {
            "best_speedup_vs_float32": speedup,
            "best_median_step_ms": best.remeasured_ms if best else None,
            "float32_median_step_ms": search.baseline.remeasured_ms if search.baseline else None,
            "trials": float(len(rows)),
            "stable_trials": float(sum(r.judgement.stable for r in rows)),
            "wall_s": wall_s, "train_s": search.train_s, "trace_s": search.trace_s,
            "outside_training_fraction": summary.outside_training_fraction,
        }.items() if v is not None},
        best=best_config, summary_markdown=summary_markdown(summary), status=status)
    store.update_run(status="finished")
    return summary


def _make_plots(summary: TuneSummary, diagnostics: dict[str, Any] | None,
                folder: Path) -> list[Path]:
    """Plots are a courtesy: a plotting problem is reported, never fatal to the job."""
    import warnings

    try:
        from tuner.plots import make_all

        return make_all(summary, diagnostics, folder)
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"could not draw the plots: {type(exc).__name__}: {exc}", stacklevel=2)
        return []


def row_record(row: TrialRow) -> dict[str, Any]:
    """A trial as plain data (trials.jsonl / trials.json)."""
    return {"number": row.number, "config": row.config.to_dict(),
            "result": row.result.to_dict(), "verdict": row.judgement.verdict.value,
            "reason": row.judgement.reason,
            "loss_decrease_ratio": row.judgement.loss_decrease_ratio,
            "median_step_ms": row.judgement.median_step_ms,
            "remeasured_ms": row.remeasured_ms, "run_id": row.run_id}
