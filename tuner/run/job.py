"""Where a run directory is opened or resumed, and a tuning job runs from start to records.

``tune(plan, executor)``: open the run directory (or resume it: finished trials are kept,
trials that were running are failed in Optuna, their MLflow runs ended as killed, and
re-queued), run the search (``tuner.run.trial_loop``), re-measure the finalists
(``tuner.run.remeasure``), and close the records: best config with provenance, trials.json, plots,
the MLflow parent run. Only this process writes the Optuna storage and MLflow.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import time
from pathlib import Path
from typing import Any

from tuner import job_context
from tuner.apply.config import PrecisionConfig
from tuner.run.plan import RunPlan
from tuner.search.proposer import Proposer, create_study, recover_study
from tuner.run.remeasure import Remeasured, remeasure
from tuner.records.results import Progress, TrialRow, TuneSummary, row_record
from tuner.records.run_store import SUBMITTED_LOG, RunStore, SubmissionLog, write_atomic
from tuner.run.trial_loop import Scheduler
from tuner.search.space import effective_placement, placed_layers
from tuner.records.timing import TimeBreakdown


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


def provenance(best: TrialRow, outcome: Remeasured, plan: RunPlan,
               task_info: dict[str, Any]) -> dict[str, Any]:
    """Where an exported config came from, with its speedup *and* that speedup's interval."""
    estimate = outcome.decision.estimate
    return {
        "task": plan.task_path.name,
        "tuned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "trial": best.number,
        "median_step_ms": round(best.remeasured_ms or best.judgement.median_step_ms or 0.0, 4),
        "speedup_vs_float32": round(estimate.ratio, 4),
        "speedup_interval": [round(estimate.low, 4), round(estimate.high, 4)],
        "confidence": estimate.confidence,
        "remeasure_rounds": estimate.rounds,
        "tie_within_noise": outcome.decision.tie,
        "decision": outcome.decision.explanation,
        "min_gain": plan.min_gain,
        "objective": plan.objective,
        "training_memory_bytes": (best.result.training_memory or {}).get("total_bytes"),
        "confirmation": _confirmation_record(best, outcome),
        "machine": machine_description(),
        "tensorflow": task_info.get("tensorflow", "?"),
        "keras": task_info.get("keras", "?"),
    }


def _confirmation_record(best: TrialRow, outcome: Remeasured) -> dict[str, Any] | None:
    """What the exported config's provenance says of its confirmation run."""
    if outcome.confirm_skipped:
        return {"verdict": "skipped", "reason": "--no-confirm: not trained longer before export"}
    confirmed = [c.to_dict() for c in outcome.confirmations if c.trial == best.number]
    rejected = [c.to_dict() for c in outcome.confirmations if c.trial != best.number]
    if confirmed:
        return {**confirmed[-1], "rejected_before": rejected}
    if rejected:
        return {"verdict": "float32: every confirmed 16-bit pick was rejected",
                "rejected_before": rejected}
    return None


class _Records:
    """Each trial in trials.jsonl (at once: the crash-safe record) and in MLflow (a child run,
    opened when it starts), written off the critical path.

    MLflow's calls (a SQLite transaction or an HTTP request each) run in order on one
    background thread, so the next trial starts while the last one is still being logged; the
    driver waits only for a trial's run id, which was created while the trial ran. ``flush``
    waits for everything queued (and raises what failed) and is called before the parent run
    closes, fails or is killed. A kill before the queue drained leaves trials in trials.jsonl
    whose MLflow runs are still open: a resume catches them up from trials.jsonl
    (``_open``).

    MLflow going away mid-run (a tracking server down, a store that refuses writes) does not
    stop the trials: the first failure is kept (``outage``), later MLflow calls are skipped
    (each would wait for the same dead store), every trial still goes to trials.jsonl and
    Optuna, and the trials MLflow misses are listed (``missing``) for the summary and run.json.
    """

    def __init__(self, tracker, store: RunStore, matches: dict[str, Any] | None,
                 clock: TimeBreakdown) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.tracker = tracker
        self.matches = matches
        self.store = store
        self.clock = clock
        self.open_runs: dict[int, Any] = {}    # trial number -> Future of its MLflow run id
        self._queue = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-records")
        self._queued: list[Any] = []
        self.outage: str | None = None    # MLflow's first failure, once it failed
        self.missing: list[int] = []       # trials in trials.jsonl that MLflow does not have

    def later(self, call, *args, **kwargs):
        future = self._queue.submit(self._guarded, call, *args, **kwargs)
        self._queued.append(future)
        return future

    def _guarded(self, call, *args, **kwargs):
        from tuner.errors import first_line

        if self.outage is not None:
            raise RuntimeError(f"MLflow unavailable: {self.outage}")
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            self.outage = f"{type(exc).__name__}: {first_line(exc, 200)}"
            raise

    def flush(self) -> None:
        """Wait until MLflow has everything queued; re-raise the first failure, unless it is
        an outage (stated in the summary instead)."""
        queued, self._queued = self._queued, []
        for future in queued:
            try:
                future.result()
            except Exception:
                if self.outage is None:
                    raise

    def open_run_ids(self) -> list[str]:
        """The MLflow runs of trials still running (their creation waited for)."""
        ids = []
        for future in self.open_runs.values():
            try:
                ids.append(future.result())
            except Exception:  # noqa: BLE001 - a run that was never created needs no closing
                pass
        return ids

    def trial_started(self, number: int, config: PrecisionConfig, optuna_number: int | None,
                      repair: bool) -> None:
        placed = placed_layers(config, self.matches) if self.matches is not None else None
        self.open_runs[number] = self.later(
            self.tracker.start_trial, number=number, config=config,
            optuna_number=optuna_number, purpose="repair" if repair else "search",
            placed=placed)

    def trial_finished(self, row: TrialRow, baseline_ms: float | None) -> None:
        began = time.perf_counter()
        try:
            row.run_id = self.open_runs.pop(row.number).result()  # created while it ran
        except Exception:
            if self.outage is None:
                raise
            row.run_id = None
        if self.matches is not None:
            row.placed = placed_layers(row.config, self.matches)
        if row.run_id is None:
            self.missing.append(row.number)
        else:
            logged = self.later(self.tracker.log_trial, row.run_id, config=row.config,
                                result=row.result, judgement=row.judgement,
                                baseline_ms=baseline_ms)
            logged.add_done_callback(lambda done, number=row.number: self._check(done, number))
        if row.number == 0 and not row.judgement.stable:
            self.flush()
            return  # the job ends here; a resume must start from a good baseline
        self.store.append_trial(row_record(row))
        row.record_s = time.perf_counter() - began
        self.clock.workers["trials"].record_s += row.record_s

    def _check(self, logged, number: int) -> None:
        if logged.exception() is not None:
            self.missing.append(number)

    def outage_lines(self) -> list[str]:
        """What the summary says when MLflow failed: since when, and what it misses."""
        if self.outage is None:
            return []
        missing = ", ".join(f"#{n}" for n in sorted(set(self.missing))) or "none"
        return [f"MLflow failed during the run ({self.outage}); the trials went on. Trials "
                f"missing from MLflow: {missing} (all are in trials.jsonl and Optuna); the "
                "job's parent run was not closed"]

    def steps_sized(self, steps: int, why: str) -> None:
        """The run's step count, decided by the sized baseline: in run.json (a resume keeps
        it) and on the MLflow parent run."""
        self.store.update_run(steps=steps, sizing=None, sized_by=why)
        self.later(self.tracker.log_sizing, steps, why)

    def close(self) -> None:
        self._queue.shutdown(wait=True)


def _open(plan: RunPlan, tracker, store: RunStore, scheduler_factory,
          task_info: dict[str, Any]) -> tuple[Any, Scheduler]:
    task_name = plan.task_path.stem
    if plan.resume:
        record = store.read_run()
        study = create_study(plan.run_dir, record["study_name"], plan.seed, resume=True,
                             objective=plan.objective)
        requeued = recover_study(study)
        store.repair_trials_log()  # the trial whose line a kill cut short is run again
        trials = store.read_trials()
        recorded = {t["run_id"] for t in trials if t.get("run_id")}
        behind = tracker.resume_parent(record["parent_run_id"], recorded=recorded)
        _tag_job(tracker, record["parent_run_id"])
        scheduler = scheduler_factory(study, requeued)
        scheduler.restore(trials)
        baseline_ms = scheduler.baseline.judgement.median_step_ms if scheduler.baseline else None
        for row in scheduler.rows:  # finished, but killed before MLflow had it: catch up
            if row.run_id in behind:
                tracker.log_trial(row.run_id, config=row.config, result=row.result,
                                  judgement=row.judgement, baseline_ms=baseline_ms)
        return study, scheduler
    study_name = f"{task_name}-{plan.run_dir.name}"
    study = create_study(plan.run_dir, study_name, plan.seed, objective=plan.objective)
    parent_id = tracker.start_parent(
        f"tune {task_name} · {plan.space.name}"
        + (f" · job {job_context.job_id()}" if job_context.job_id() else ""),
        params={**plan.settings(), "slow_factor": plan.slow_factor,
                "finalists": plan.finalists},
        tags={"run_dir": str(plan.run_dir.resolve()), "machine": machine_description(),
              **job_context.parent_tags()})
    store.write_run({**plan.settings(), "ceiling": task_info.get("ceiling"),
                     "study_name": study_name, "parent_run_id": parent_id,
                     "experiment": f"precision-tuner/{task_name}", "status": "running",
                     "created_at": datetime.datetime.now(datetime.timezone.utc)
                     .isoformat(timespec="seconds")})
    return study, scheduler_factory(study, [])


def tune(plan: RunPlan, executor, progress: Progress | None = None,
         task_info: dict[str, Any] | None = None, started: float | None = None,
         diagnostics: dict[str, Any] | None = None,
         clock: TimeBreakdown | None = None) -> TuneSummary:
    """Run (or resume) a whole tuning job; the caller has validated input and resolved the
    plan (already informed by ``diagnostics``, which are recorded here). ``started`` (a
    ``time.perf_counter()`` value) lets the caller include its own start-up in the wall time,
    and ``clock`` the phases it timed (start-up, task check, diagnostics).
    """
    from tuner.records.mlflow_records import Tracker, default_tracking_uri

    started = time.perf_counter() if started is None else started
    task_info = task_info or {}
    clock = clock or TimeBreakdown()
    opening = time.perf_counter()
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    store = RunStore(plan.run_dir)
    executor.submissions = SubmissionLog(plan.run_dir / SUBMITTED_LOG)
    if diagnostics is not None:
        write_atomic(plan.run_dir / "diagnostics.json", json.dumps(diagnostics, indent=1))
    tracking_uri = plan.tracking_uri or default_tracking_uri(plan.run_dir)
    tracker = Tracker(tracking_uri, plan.run_dir, f"precision-tuner/{plan.task_path.stem}")
    if job_context.job_id() is not None:
        tracker.trial_tags = {job_context.JOB_ID_TAG: job_context.job_id()}
    records = _Records(tracker, store, plan.matches, clock)

    def scheduler_factory(study, requeued) -> Scheduler:
        proposer = Proposer(plan.space, study, enumerate_space=plan.enumerates_space,
                            requeued=requeued, matches=plan.matches, objective=plan.objective)
        return Scheduler(plan, executor, proposer, records, progress, clock)

    _, scheduler = _open(plan, tracker, store, scheduler_factory, task_info)
    if hasattr(executor, "announce"):  # a shared cluster: say in MLflow when waiting for a node
        executor.announce = lambda phase: _announce(tracker, phase)
    if diagnostics is not None:
        records.later(tracker.log_diagnostics, diagnostics)
    if task_info.get("ceiling"):
        records.later(tracker.log_ceiling, task_info["ceiling"])
    clock.add("opening records", time.perf_counter() - opening)
    try:
        with clock.phase("trials"):
            exhausted = scheduler.run()
            # Nothing of ours may run beside the re-measurement's timings.
            records.flush()
        plan = scheduler.plan  # with the sized step count
        with clock.phase("re-measurement"):
            outcome = remeasure(scheduler)
        # The confirmation runs inside the re-measurement's session (on its live models).
        clock.carve("re-measurement", "confirmation",
                    sum(c.seconds for c in outcome.confirmations))
        _record_exclusive_phases(executor, store, tracker)
    except KeyboardInterrupt:
        # Ctrl-C: close what is open, leave the study resumable (its RUNNING trials are
        # re-queued by the next `tune` on this run directory), and stop.
        _flush_quietly(records)
        store.update_run(status="interrupted")
        if records.outage is None:
            for run_id in records.open_run_ids():
                tracker.kill_trial(run_id, "interrupted (Ctrl-C); re-queued on resume")
            tracker.client.set_terminated(tracker.parent_id, "KILLED")
        raise
    except Exception:
        _flush_quietly(records)
        store.update_run(status="failed")
        if records.outage is None:
            tracker.client.set_terminated(tracker.parent_id, "FAILED")
        raise
    finally:
        records.close()
    if plan.objective != "speed" and getattr(executor, "runs_here", False):
        with clock.phase("memory check"):
            outcome.objective_lines.append(_fresh_rss_line(plan, outcome.winner,
                                                           scheduler.baseline))
    with clock.phase("records and plots"):
        if records.outage is None:
            for row in scheduler.rows:
                if row.remeasured_ms is not None and row.run_id:
                    tracker.log_remeasure(row.run_id, row.remeasured_ms, row.estimate)
        summary = _summary(plan, scheduler, outcome, exhausted, started, tracker, task_info)
        summary.record_notes = records.outage_lines() + _node_losses(executor, store)
        _close_records(plan, summary, scheduler, tracker if records.outage is None else None,
                       store, diagnostics, mlflow_missing=sorted(set(records.missing)))
    # The wall time and its breakdown include the records, so they are written last.
    summary.wall_s, summary.breakdown = time.perf_counter() - started, clock
    timing = clock.to_dict(summary.wall_s)
    write_atomic(plan.run_dir / "timing.json", json.dumps(timing, indent=1))
    if records.outage is None:
        tracker.log_timing({**clock.metrics(summary.wall_s), "wall_s": summary.wall_s,
                            "outside_training_fraction": summary.outside_training_fraction},
                           timing)
    return summary


def _flush_quietly(records: _Records) -> None:
    """Drain the MLflow queue on the way out of a failed job: the job's own error is the one
    to report."""
    try:
        records.flush()
    except Exception:  # noqa: BLE001
        pass


def _fresh_rss_line(plan: RunPlan, winner: TrialRow, baseline: TrialRow) -> str:
    """The peak RSS of a fresh process training the pick and float32: the check, on this
    machine, of the counted training memory the objective chose by."""
    from tuner.execution.local import fresh_process_peak_rss
    from tuner.run.trial_loop import make_spec

    figures = []
    for label, row in (("float32", baseline), (f"the pick #{winner.number}", winner)):
        if label != "float32" and winner is baseline:
            continue
        peak = fresh_process_peak_rss(make_spec(plan, row.number, row.config))
        figures.append(f"{label} {peak / 1e6:.0f} MB" if peak else f"{label} failed")
    return ("check: peak RSS of a fresh process training it (TensorFlow's own footprint "
            "included): " + ", ".join(figures))


def _summary(plan: RunPlan, scheduler: Scheduler, outcome: Remeasured, exhausted: bool,
             started: float, tracker, task_info: dict[str, Any]) -> TuneSummary:
    best = outcome.winner
    config = best.config
    if plan.matches is not None:  # export only the placements that change something
        config = dataclasses.replace(config, float32=effective_placement(config, plan.matches))
    best_config = PrecisionConfig.from_dict(
        {**config.to_dict(), "provenance": provenance(best, outcome, plan, task_info)})
    return TuneSummary(
        rows=sorted(scheduler.rows, key=lambda r: r.number), best=best,
        baseline=scheduler.baseline, estimate=outcome.decision.estimate,
        wall_s=time.perf_counter() - started, train_s=scheduler.train_s,
        trace_s=scheduler.trace_s, run_dir=plan.run_dir, parent_run_id=tracker.parent_id,
        tracking_uri=tracker.tracking_uri, space_exhausted=exhausted, task_info=task_info,
        best_config=best_config, shared_remeasure=outcome.shared, tie=outcome.decision.tie,
        decision=outcome.decision.explanation, remeasure_notes=outcome.notes,
        objective_lines=outcome.objective_lines, confirmations=outcome.confirmations,
        confirm_skipped=outcome.confirm_skipped)


def _close_records(plan: RunPlan, summary: TuneSummary, scheduler: Scheduler, tracker,
                   store: RunStore, diagnostics: dict[str, Any] | None,
                   mlflow_missing: list[int] = ()) -> None:
    """The run's closing records; ``tracker`` None when MLflow failed during the run (the
    files are written, run.json lists the trials MLflow misses)."""
    from tuner.records.report import summary_markdown

    summary.best_config.save(plan.run_dir / "best_precision.json", overwrite=True)
    store.write_trials([row_record(r) for r in summary.rows])
    plots = _make_plots(summary, diagnostics, plan.run_dir / "plots")
    if tracker is None:
        store.update_run(status="finished", mlflow_missing=list(mlflow_missing))
        return
    tracker.log_plots(plots)
    if summary.confirmations:
        tracker.log_confirmation([c.to_dict() for c in summary.confirmations])
    estimate, best, baseline = summary.estimate, summary.best, summary.baseline
    metrics = {
        "best_speedup_vs_float32": estimate.ratio if estimate else None,
        "best_speedup_low": estimate.low if estimate else None,
        "best_speedup_high": estimate.high if estimate else None,
        "tie_within_noise": float(summary.tie),
        "best_median_step_ms": best.remeasured_ms if best else None,
        "float32_median_step_ms": baseline.remeasured_ms if baseline else None,
        "trials": float(len(summary.rows)),
        "stable_trials": float(sum(r.judgement.stable for r in summary.rows)),
        "wall_s": summary.wall_s, "train_s": summary.train_s, "trace_s": summary.trace_s,
        "outside_training_fraction": summary.outside_training_fraction,
    }
    tracker.finish_parent(metrics={k: v for k, v in metrics.items() if v is not None},
                          best=summary.best_config, summary_markdown=summary_markdown(summary),
                          status="FINISHED", table=trials_table(summary))
    store.update_run(status="finished")


def trials_table(summary: TuneSummary) -> dict[str, list]:
    """Every trial's config, verdict, speedup and median step time, one column each (the
    parent run's summary table in MLflow)."""
    base = summary.baseline.judgement.median_step_ms if summary.baseline else None
    columns: dict[str, list] = {"trial": [], "config": [], "verdict": [], "speedup_vs_float32": [],
                                "median_step_ms": [], "remeasured_ms": [], "val_loss": [],
                                "reason": []}
    for row in summary.rows:
        median = row.judgement.median_step_ms
        if row.estimate is not None and row is not summary.baseline:
            speedup = round(row.estimate.ratio, 4)
        else:
            speedup = round(base / median, 4) if base and median else None
        columns["trial"].append(row.number)
        columns["config"].append(row.config.describe() + (" ★" if row is summary.best else ""))
        columns["verdict"].append(row.judgement.verdict.value)
        columns["speedup_vs_float32"].append(speedup)
        columns["median_step_ms"].append(None if median is None else round(median, 4))
        columns["remeasured_ms"].append(None if row.remeasured_ms is None
                                        else round(row.remeasured_ms, 4))
        columns["val_loss"].append((row.result.validation or {}).get("loss"))
        columns["reason"].append(row.judgement.reason or "")
    return columns


def _tag_job(tracker, parent_id: str) -> None:
    """A resumed run: the job that resumes it joins the parent run's job ids."""
    if job_context.job_id() is None:
        return
    previous = tracker.client.get_run(parent_id).data.tags.get(job_context.JOB_IDS_TAG)
    for key, value in job_context.parent_tags(previous).items():
        tracker.client.set_tag(parent_id, key, value)


def _announce(tracker, phase: str) -> None:
    """What a service job is doing now (e.g. waiting for a node), on its parent run and in its
    log, so ``precision-tuner status`` shows it."""
    print(f"precision-tuner: {phase}", flush=True)
    try:
        tracker.client.set_tag(tracker.parent_id, job_context.PHASE_TAG, phase[:5000])
    except Exception:  # noqa: BLE001 - a status line must never stop the job
        pass


def _node_losses(executor, store: RunStore) -> list[str]:
    """Ray nodes lost mid-trial (their trials ran again elsewhere): run.json and the summary."""
    losses = list(getattr(executor, "node_losses", []) or [])
    if losses:
        store.update_run(node_losses=losses)
    return losses


def _record_exclusive_phases(executor, store: RunStore, tracker) -> None:
    """When and on which node the finalists were timed with a node to themselves: run.json and
    the parent run (``exclusive_phases.json``), so overlaps between jobs can be checked."""
    phases = list(getattr(executor, "exclusive_phases", []) or [])
    if not phases:
        return
    store.update_run(exclusive_phases=phases)
    tracker.client.log_dict(tracker.parent_id, {"phases": phases}, "exclusive_phases.json")


def _make_plots(summary: TuneSummary, diagnostics: dict[str, Any] | None,
                folder: Path) -> list[Path]:
    """Plots are a courtesy: a plotting problem is reported, never fatal to the job."""
    import warnings

    try:
        from tuner.records.plots import make_all

        return make_all(summary, diagnostics, folder)
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"could not draw the plots: {type(exc).__name__}: {exc}", stacklevel=2)
        return []
