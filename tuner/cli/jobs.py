"""The job commands: ``submit``, ``jobs``, ``status``, ``logs``, ``stop``, ``fetch``, and the
service's UI links (tuner.service.client talks to the service)."""

from __future__ import annotations

import datetime
import getpass
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuner import job_context
from tuner.apply.config import PrecisionConfig
from tuner.cli.tune_parser import options_from
from tuner.errors import UsageError, first_line
from tuner.execution.task_shipping import data_file_of
from tuner.records.mlflow_stores import TRIALS_QUERY
from tuner.run.option_checks import option_fields
from tuner.run.options import TuneOptions
from tuner.run.plan import resolve
from tuner.run.task_file import check_task_file
from tuner.service.client import Service, entrypoint, is_space_file, job_tune_args, new_job_id
from tuner.service.contract import JOB_KIND

# tune options that a job passes on as given (the rest -- run directory, tracking, Ray address,
# output -- are the service's business: ``Option.forwarded``).
_FORWARDED = [option for option in option_fields(TuneOptions) if option.option.forwarded]
FORWARDED = tuple(option.name for option in _FORWARDED)


# -- submit --------------------------------------------------------------------------------
def forwarded_flags(args) -> list[str]:
    """The tune flags the user gave, as command-line words (defaults left out)."""
    words: list[str] = []
    for option in _FORWARDED:
        value = getattr(args, option.name)
        if value is None or value is False or value == option.default:
            continue
        words += [option.flag] if value is True else [option.flag, str(value)]
    return words


def check_submission(args) -> tuple[Path, Path | None]:
    """Everything ``tune`` would refuse, refused here, before anything is sent: the same
    one-line messages, exit code 2. Returns the task file and the space file (if a file)."""
    task_path = check_task_file(args.task)
    if args.resume_job:
        return task_path, None
    # The very options tune would resolve (the run directory and tracking are the service's).
    resolve(options_from(args, run_dir=Path(".")), None)
    space_file = Path(args.space).resolve() if is_space_file(args.space) else None
    return task_path, space_file


def submit(args) -> int:
    task_path, space_file = check_submission(args)
    user_flags = forwarded_flags(args)
    if args.resume_job and user_flags:
        raise UsageError(f"--resume {args.resume_job} continues that job with its own flags; "
                         f"drop {' '.join(user_flags)}")
    service = Service(args)
    if args.worker_cpus != 1 and service.record.get("warm_workers", "0") != "0":
        raise UsageError(f"--worker-cpus {args.worker_cpus}: this service lends warm workers "
                         "of 1 CPU each, which hold its nodes' CPUs. Drop --worker-cpus, or "
                         "start the service with --warm-workers 0.")
    job_id = new_job_id(task_path)
    resumes = ""
    if args.resume_job:
        old = service.recorded_job(args.resume_job)
        if old["task"] != task_path.name:
            raise UsageError(f"--resume {args.resume_job} tuned {old['task']!r}, not "
                             f"{task_path.name!r}. Pass that task file.")
        if old["running"]:
            raise UsageError(f"--resume {args.resume_job}: that job is still "
                             f"{old['status']}. Stop it first (`precision-tuner stop "
                             f"{args.resume_job}`).")
        run_root, tune_args = old["run_root"], old["tune_args"]
        user_flags, resumes = old["flags"], args.resume_job
    else:
        run_root = f"{service.record['service_dir']}/jobs/{job_id}"
        tune_args = job_tune_args(user_flags, run_root)
    submitter = getpass.getuser()
    metadata = {"precision_tuner": JOB_KIND, "task": task_path.name, "submitted_by": submitter,
                "flags": " ".join(user_flags) or "-", "flags_json": json.dumps(user_flags),
                "tune_args": json.dumps(tune_args), "run_root": run_root,
                "resumes": resumes or "-"}
    env_vars = {job_context.JOB_ID_ENV: job_id, job_context.SUBMITTER_ENV: submitter,
                job_context.FLAGS_ENV: json.dumps(user_flags),
                job_context.WORKER_CPUS_ENV: str(args.worker_cpus),
                "PYTHONUNBUFFERED": "1"}
    if resumes:
        env_vars[job_context.RESUMES_ENV] = resumes
    data = data_file_of(task_path, task_path.read_text())   # tune()'s objects, beside the task
    files = {path.name: path.read_bytes() for path in (task_path, space_file, data) if path}
    command = entrypoint(task_name=task_path.name,
                         space_name=space_file.name if space_file else None,
                         run_root=run_root, tracking_uri=service.tracking_uri,
                         tune_args=tune_args, resume=bool(resumes))
    service.server.submit(entrypoint=command, submission_id=job_id, metadata=metadata,
                          env_vars=env_vars, files=files)
    print(job_id)
    print(f"submitted {task_path.name} as job {job_id}"
          + (f" (resuming {resumes})" if resumes else "")
          + f"; watch it: precision-tuner status {job_id} / logs {job_id} --follow",
          file=sys.stderr)
    return 0


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
    rows = [("JOB", "TASK", "BY", "STATUS", "TRIALS", "BEST SO FAR", "SUBMITTED")]
    for info in service.tuning_jobs():
        progress = service.progress(info.submission_id)
        status = info.status.value
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
    info = service.job(args.job)
    progress = service.progress(args.job)
    meta = info.metadata
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
    (finished trials kept, the running one ended as killed); nothing else is touched."""
    service = Service(args)
    info = service.job(args.job)
    if info.status.is_terminal():
        print(f"job {args.job} already ended: {info.status.value}")
        return 0
    service.jobs.stop_job(args.job)
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
