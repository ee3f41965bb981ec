"""The search: a tune job's plan run from its run directory opened to its records closed.

``run_search(plan, executor)`` (tuner.api.job runs it): open the run directory (or resume it:
finished trials are kept, trials that were running are failed in Optuna, their MLflow runs
ended as killed, and re-queued), run the trials (``tuner.run.trial_loop``), re-measure the
finalists (``tuner.run.remeasure``) and confirm the pick (``tuner.run.confirmation_run``), and
close the records: best config with provenance, trials.json, plots, the MLflow parent run. Only
this process writes the Optuna storage and MLflow.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

from tuner import job_context
from tuner.execution.base import Executor
from tuner.machine import machine_description
from tuner.records.mlflow_records import Tracker
from tuner.records.mlflow_stores import default_tracking_uri
from tuner.records.results import Progress, TuneSummary
from tuner.records.run_store import SUBMITTED_LOG, RunStore, SubmissionLog, write_atomic
from tuner.records.timing import TimeBreakdown
from tuner.run.by_objective import winner_of
from tuner.run.closing import (
    close_records,
    float32_math,
    fresh_rss_line,
    node_losses,
    plot_diagnostics_early,
    record_exclusive_phases,
    summary_of,
)
from tuner.run.plan import RunPlan
from tuner.run.trial_loop import Scheduler
from tuner.run.trial_records import TrialRecorder, flush_quietly
from tuner.search.proposer import Proposer, create_study, recover_study, study_storage
from tuner.search.study_versions import continue_study, fits
from tuner.task_facts import TaskFacts


def _open(plan: RunPlan, tracker, store: RunStore, scheduler_factory,
          facts: TaskFacts, chosen: dict | None = None
          ) -> tuple[Scheduler, list[str]]:
    """The run's study opened (or resumed, its running trials re-queued) and the scheduler
    over it, with the lines a resume has to say."""
    task_name = plan.task_path.stem
    if plan.resume:
        record = store.read_run()
        study = create_study(plan.run_dir, record["study_name"], plan.seed, resume=True,
                             objective=plan.objective)
        requeued = recover_study(study)
        study, notes = continue_study(study, plan.space, study_storage(plan.run_dir))
        if study.study_name != record["study_name"]:
            store.update_run(study_name=study.study_name)
            notes += [f"re-queued trial {params} left out: the space no longer offers it"
                      for params in requeued if not fits(params, plan.space)]
            requeued = [params for params in requeued if fits(params, plan.space)]
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
        return scheduler, notes
    study_name = f"{task_name}-{plan.run_dir.name}"
    study = create_study(plan.run_dir, study_name, plan.seed, objective=plan.objective)
    parent_id = tracker.start_parent(
        f"tune {task_name} · {plan.space.name}"
        + (f" · job {job_context.job_id()}" if job_context.job_id() else ""),
        params={**plan.settings(), "slow_factor": plan.slow_factor,
                "finalists": plan.finalists,
                **({"executor": chosen["kind"], "workers": chosen["workers"],
                    "executor_why": chosen["why"]} if chosen else {})},
        tags={"run_dir": str(plan.run_dir.resolve()), "machine": machine_description(),
              **job_context.parent_tags()})
    store.write_run({**plan.settings(), "ceiling": facts.ceiling, "executor": chosen,
                     "tf32": float32_math(facts, plan),
                     "study_name": study_name, "parent_run_id": parent_id,
                     "experiment": f"precision-tuner/{task_name}", "status": "running",
                     "created_at": datetime.datetime.now(datetime.timezone.utc)
                     .isoformat(timespec="seconds")})
    return scheduler_factory(study, []), []


def run_search(plan: RunPlan, executor: Executor, progress: Progress | None = None,
               facts: TaskFacts | None = None, started: float | None = None,
               diagnostics: dict[str, Any] | None = None, clock: TimeBreakdown | None = None
               ) -> TuneSummary:
    """Run (or resume) the search of ``plan``; the caller has validated input and resolved the
    plan (already informed by ``diagnostics``, which are recorded here). ``started`` (a
    ``time.perf_counter()`` value) lets the caller include its own start-up in the wall time,
    and ``clock`` the phases it timed (start-up, task check, diagnostics)."""
    started = time.perf_counter() if started is None else started
    facts = facts or TaskFacts()
    clock = clock or TimeBreakdown()
    opening = time.perf_counter()
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    store = RunStore(plan.run_dir)
    executor.submissions = SubmissionLog(plan.run_dir / SUBMITTED_LOG)
    if diagnostics is not None:
        write_atomic(plan.run_dir / "diagnostics.json", json.dumps(diagnostics, indent=1))
    tracker = _tracker(plan)
    records = TrialRecorder(tracker, store, plan.learned.matches, clock)

    def scheduler_factory(study, requeued) -> Scheduler:
        proposer = Proposer(plan.space, study, enumerate_space=plan.enumerates_space,
                            requeued=requeued, matches=plan.learned.matches,
                            objective=plan.objective)
        return Scheduler(plan, executor, proposer, records, progress, clock)

    scheduler, notes = _open(plan, tracker, store, scheduler_factory, facts, executor.chosen)
    # On a shared cluster the executor may wait (for a node): the wait is said in MLflow.
    executor.announce = lambda phase: _announce(tracker, phase)
    early_plots = _record_facts(records, tracker, plan, diagnostics, facts)
    clock.add("opening records", time.perf_counter() - opening)
    exhausted, outcome = _phases(scheduler, executor, records, store, tracker, clock)
    plan = scheduler.plan  # with the sized step count
    if plan.objective.uses_memory and executor.runs_here:
        with clock.phase("memory check"):
            outcome.objective_lines.append(fresh_rss_line(plan, outcome.winner,
                                                           scheduler.baseline))
    with clock.phase("records and plots"):
        if records.outage is None:
            for row in scheduler.rows:
                if row.remeasured_ms is not None and row.run_id:
                    tracker.log_remeasure(row.run_id, row.remeasured_ms, row.estimate)
        summary = summary_of(plan, scheduler, outcome, exhausted, started, tracker, facts)
        summary.record_notes = notes + records.outage_lines() + node_losses(executor, store)
        close_records(plan, summary, scheduler, tracker if records.outage is None else None,
                       store, None if early_plots else diagnostics,
                       mlflow_missing=sorted(set(records.missing)))
    # The wall time and its breakdown include the records, so they are written last.
    summary.wall_s, summary.breakdown = time.perf_counter() - started, clock
    timing = clock.to_dict(summary.wall_s)
    write_atomic(plan.run_dir / "timing.json", json.dumps(timing, indent=1))
    if records.outage is None:
        tracker.log_timing({**clock.metrics(summary.wall_s), "wall_s": summary.wall_s,
                            "outside_training_fraction": summary.outside_training_fraction},
                           timing)
    return summary


def _record_facts(records: TrialRecorder, tracker: Tracker, plan: RunPlan,
                  diagnostics: dict[str, Any] | None, facts: TaskFacts) -> list[Path]:
    """The diagnostics and the device's ceiling on the parent run, behind the first trial's
    run; the diagnostics' plot drawn there too. Returns the plots so drawn (once flushed)."""
    early_plots: list[Path] = []
    if diagnostics is not None:
        records.after_first_trial(tracker.log_diagnostics, diagnostics)
        records.after_first_trial(plot_diagnostics_early, diagnostics, plan.run_dir / "plots",
                                  tracker, early_plots)
    if facts.ceiling:
        records.after_first_trial(tracker.log_ceiling, facts.ceiling)
    return early_plots


def _tracker(plan: RunPlan) -> Tracker:
    """The run's MLflow records: the plan's server, or SQLite in the run directory; a service
    job's trials tagged with its id."""
    tracking_uri = plan.tracking_uri or default_tracking_uri(plan.run_dir)
    tracker = Tracker(tracking_uri, plan.run_dir, f"precision-tuner/{plan.task_path.stem}")
    if job_context.job_id() is not None:
        tracker.trial_tags = {job_context.JOB_ID_TAG: job_context.job_id()}
    return tracker


def _phases(scheduler: Scheduler, executor, records: TrialRecorder, store: RunStore, tracker,
            clock: TimeBreakdown):
    """The trials, the re-measurement and the confirmation: ``(space exhausted, outcome)``;
    then a service job's driver steps aside (``_step_aside``). On Ctrl-C or an error, what
    is open is closed (the study stays resumable) and it raises."""
    try:
        with clock.phase("trials"):
            exhausted = scheduler.run()
            # Nothing of ours may run beside the re-measurement's timings.
            records.flush()
        with clock.phase("re-measurement"):
            outcome = winner_of(scheduler)
        # The confirmation runs inside the re-measurement's session (on its live models).
        clock.carve("re-measurement", "confirmation",
                    sum(c.seconds for c in outcome.confirmations))
        record_exclusive_phases(executor, store, tracker)
        with clock.phase("shutdown"):   # Ray's, where it runs: inside the wall time
            executor.shut_down()
        _step_aside()
        return exhausted, outcome
    except KeyboardInterrupt:
        # Ctrl-C: close what is open, leave the study resumable (its RUNNING trials are
        # re-queued by the next `tune` on this run directory), and stop.
        flush_quietly(records)
        store.update_run(status="interrupted")
        if records.outage is None:
            for run_id in records.open_run_ids():
                tracker.kill_trial(run_id, "interrupted (Ctrl-C); re-queued on resume")
            tracker.client.set_terminated(tracker.parent_id, "KILLED")
        raise
    except Exception:
        flush_quietly(records)
        store.update_run(status="failed")
        if records.outage is None:
            tracker.client.set_terminated(tracker.parent_id, "FAILED")
        raise
    finally:
        records.close()


# A service job's driver, its timed phases over: the niceness it takes for the rest.
AFTER_TIMING_NICENESS = 10


def _step_aside() -> None:
    """A service job whose timed phases are over (re-measurement, confirmation) lowers its
    driver's CPU priority for what is left (records, plots, the export). The node lock keeps
    other jobs' trials off a re-measurement, not their drivers: on a shared 2-core node one
    job's plots (2-3 s of CPU) ran beside the next job's re-measurement. Where the CPU is
    free this costs nothing. Only in a service job, whose driver is a process of its own that
    ends with the job (never a user's notebook or script)."""
    if job_context.job_id() is None:
        return
    try:                        # Linux: a niceness per thread (the records' thread included)
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, now + AFTER_TIMING_NICENESS))
        except OSError:
            pass


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
