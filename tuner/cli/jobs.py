"""The job commands: ``jobs``, ``status``, ``logs``, ``stop``, ``fetch``, and the service's UI
links (tuner.service.client talks to the service); ``submit`` is tuner.cli.submit's."""

from __future__ import annotations

import datetime
import getpass
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuner import job_context
from tuner.apply.config import PrecisionConfig
from tuner.errors import UsageError, first_line
from tuner.records.mlflow_stores import TRIALS_QUERY
from tuner.service import job_book
from tuner.service.client import Service
from tuner.service.limits import ServiceLimits


# -- watching ------------------------------------------------------------------------------
def _when(millis: int | None) -> str:
    if not millis:
        return "-"
    return datetime.datetime.fromtimestamp(millis / 1000).strftime("%m-%d %H:%M:%S")


def _trials_text(progress: dict[str, Any]) -> str:
    planned = progress["planned"]
    return f"{progress['done']}/{planned}" if planned else str(progress["done"])


def list_jobs(args) -> int:
    service = Service(args)
    for line in service.close_orphans():
        print(line, file=sys.stderr)
    jobs = service.tuning_jobs()
    queue = service.queue(jobs)
    places = {job.submission_id: place for place, job in enumerate(queue, start=1)}
    rows = [("JOB", "TASK", "BY", "STATUS", "TRIALS", "BEST SO FAR", "SUBMITTED")]
    for info in jobs:
        status = info.status.value
        if status == "PENDING":   # waiting for a turn: no run, nothing to ask MLflow
            status = (f"QUEUED ({places[info.submission_id]} of {len(queue)})"
                      if info.submission_id in places else "STOPPED (left the queue)")
            rows.append((info.submission_id, info.metadata.get("task", "?"),
                         info.metadata.get("submitted_by", "?"), status, "-", "-",
                         _when(info.start_time)))
            continue
        progress = service.progress(info.submission_id)
        if status == "RUNNING" and (progress["phase"] or "").startswith("waiting"):
            status = "RUNNING (waiting for a node)"
        rows.append((info.submission_id, info.metadata.get("task", "?"),
                     info.metadata.get("submitted_by", "?"), status, _trials_text(progress),
                     progress["best"] or "-", _when(info.start_time)))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    if len(rows) == 1:
        print("(no jobs yet: precision-tuner submit TASK.py)")
    else:
        running = sum(1 for job in jobs if job.status.value == "RUNNING")
        print(f"({running} running of the service's {ServiceLimits.of(service.record).turns} "
              f"at once, {len(queue)} queued: they start in this order)")
    return 0


def failure_reason(service: Service, info) -> str | None:
    """Why a job failed, in one line: tune's own error line from the job's log, else Ray's."""
    try:
        logs = service.jobs.get_job_logs(info.submission_id)
    except Exception:  # noqa: BLE001 - no log to read (a job gone): Ray's own message says why
        logs = ""
    for line in reversed(logs.splitlines()):
        if line.startswith(("precision-tuner: error:", "precision-tuner: failed:")):
            return line
    for line in reversed(logs.splitlines()):
        if "Error" in line or "error" in line:
            return line.strip()[:300]
    return first_line(Exception(info.message or "")) if info.message else None


def status(args) -> int:
    service = Service(args)
    service.job(args.job)
    # The job's state and the queue it stands in come from one listing: read apart, a job that
    # starts between the two reads would be neither queued nor running.
    jobs = service.tuning_jobs()
    info = next((job for job in jobs if job.submission_id == args.job), None) \
        or service.job(args.job)
    meta = info.metadata
    if info.status.value == "PENDING":
        print("\n".join(_queued_lines(service, info, jobs)))
        return 0
    progress = service.progress(args.job)
    lines = [f"job {info.submission_id}: {info.status.value}",
             f"  task: {meta.get('task')}  submitted by: {meta.get('submitted_by')}  "
             f"flags: {meta.get('flags')}",
             f"  started: {_when(info.start_time)}  ended: {_when(info.end_time)}",
             f"  trials finished: {_trials_text(progress)}  best so far: "
             f"{progress['best'] or '-'}"]
    if progress["phase"] and not info.status.is_terminal():
        lines.append(f"  now: {progress['phase']}")
    if meta.get("resumes", "-") != "-":
        lines.append(f"  resumes: {meta['resumes']}")
    if info.status.value == "FAILED":
        lines.append(f"  reason: {failure_reason(service, info) or info.message}")
    if progress["parent"] is not None:
        parent = progress["parent"]
        lines.append(f"  MLflow: {service.tracking_uri}/#/experiments/"
                     f"{parent.info.experiment_id}/runs/{parent.info.run_id}")
    print("\n".join(lines))
    return 0


def _queued_lines(service: Service, info, jobs: list) -> list[str]:
    """A waiting job (``info``, PENDING in ``jobs``, the listing it was read from): its place
    in the queue and what it waits for."""
    meta = info.metadata
    queue = [job.submission_id for job in service.queue(jobs)]
    head = [f"  task: {meta.get('task')}  submitted by: {meta.get('submitted_by')}  "
            f"flags: {meta.get('flags')}", f"  submitted: {_when(info.start_time)}"]
    if info.submission_id not in queue:    # PENDING in this listing, so a stop was asked for
        return [f"job {info.submission_id}: STOPPED while it waited (it leaves Ray's queue "
                "when its turn comes, without starting)", *head]
    running = [job.submission_id for job in jobs if job.status.value == "RUNNING"]
    turns = ServiceLimits.of(service.record).turns
    place = queue.index(info.submission_id) + 1
    return [f"job {info.submission_id}: QUEUED, {place} of {len(queue)} in line", *head,
            f"  waits for: one of the service's {turns} job turn(s), held by "
            + (", ".join(running) if running else "jobs starting now")
            + (f"; {place - 1} queued job(s) go first" if place > 1 else "; it goes next"),
            f"  it holds no process until then; `precision-tuner stop {info.submission_id}` "
            "takes it out of the queue"]


def logs(args) -> int:
    service = Service(args)
    service.job(args.job)
    if not args.follow:
        sys.stdout.write(service.jobs.get_job_logs(args.job))
        return 0
    import asyncio

    async def follow() -> None:
        async for chunk in service.jobs.tail_job_logs(args.job):
            sys.stdout.write(chunk)
            sys.stdout.flush()

    asyncio.run(follow())
    return 0


def stop(args) -> int:
    """Stop a job: Ray sends it SIGINT, ``tune`` closes its records as it does on Ctrl-C
    (finished trials kept, the running one ended as killed); nothing else is touched. A
    queued job leaves the queue: it never starts."""
    service = Service(args)
    info = service.job(args.job)
    if info.status.is_terminal():
        print(f"job {args.job} already ended: {info.status.value}")
        return 0
    # In the service's book first, so that no restart queues it again (tuner.service.job_book).
    service.intake.put_text(job_book.artifact_path(args.job, job_book.STOP_REQUESTED),
                            f"stopped by {getpass.getuser()}\n")
    service.jobs.stop_job(args.job)
    if info.status.value == "PENDING":
        # Ray ends a waiting job when its turn comes; its entrypoint sees the request and
        # exits without starting anything.
        print(f"job {args.job}: taken out of the queue before it started (nothing ran, "
              f"nothing recorded). Submit it again: precision-tuner submit "
              f"{info.metadata.get('task')}")
        return 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        info = service.jobs.get_job_info(args.job)
        if info.status.is_terminal():
            break
        time.sleep(0.5)
    parent = service.parent_run(args.job)
    if parent is not None:
        service.mlflow.set_tag(parent.info.run_id, job_context.TAG_PREFIX + "job_status",
                               "stopped")
        if parent.info.status == "RUNNING":  # killed before it could close its own records
            service.mlflow.set_terminated(parent.info.run_id, "KILLED")
    progress = service.progress(args.job)
    print(f"job {args.job}: {info.status.value}; {progress['done']} finished trial(s) kept. "
          f"Continue it: precision-tuner submit {info.metadata.get('task')} --resume {args.job}")
    return 0


def fetch(args) -> int:
    """Download the job's exported config from MLflow (works after the job ended, anywhere)."""
    if args.out.exists() and not args.force:
        raise UsageError(f"--out {str(args.out)!r} already exists. Pass --force to overwrite it,"
                         " or choose another --out.")
    if args.out.suffix.lower() not in (".json", ".yaml", ".yml"):
        raise UsageError(f"--out must end in .json, .yaml or .yml. Received: --out {args.out}")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    service = Service(args)
    info = service.job(args.job, required=False)   # MLflow has the config even if Ray forgot
    parent = service.parent_run(args.job)
    if info is None and parent is None:
        service.job(args.job)  # says: no such job
    names = []
    if parent is not None:
        names = [a.path for a in service.mlflow.list_artifacts(parent.info.run_id)]
    if "best_precision.json" not in names:
        state = info.status.value if info is not None else parent.info.status
        raise UsageError(f"job {args.job} has no exported config (job status {state}). Wait "
                         f"until it succeeds (`precision-tuner status {args.job}`), or resume "
                         "it.")
    with tempfile.TemporaryDirectory() as folder:
        local = service.mlflow.download_artifacts(parent.info.run_id, "best_precision.json",
                                                  folder)
        config = PrecisionConfig.load(local)
    config.save(args.out, overwrite=True)
    print(f"wrote {args.out}: {config.describe()} (job {args.job}, "
          f"{Path(parent.data.params.get('task', '?')).name})")
    return 0


def ui_links(args) -> int:
    """The service's MLflow UI: one experiment per task, runs tagged with their job id."""
    import webbrowser

    service = Service(args)
    base = service.tracking_uri
    print(f"MLflow UI of the service: {base}")
    for experiment in service.mlflow.search_experiments(
            filter_string="name LIKE 'precision-tuner/%'"):
        runs = f"{base}/#/experiments/{experiment.experiment_id}/runs"
        print(f"  {experiment.name}: {runs}?{TRIALS_QUERY}")
    if not args.no_browser:
        try:
            webbrowser.open(base)
        except Exception:  # noqa: BLE001 - no browser here: the links are printed
            pass
    return 0
