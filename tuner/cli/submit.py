"""``precision-tuner submit``: a task sent to the service as a job (tuner.service.client talks to
the service). Everything ``tune`` would refuse is refused first, then the service's limits
(tuner.service.limits); the job's files and submission go into the service's book
(tuner.service.job_book, through tuner.service.intake) before Ray's job server gets the job,
which then waits in Ray's queue for one of the service's job turns."""

from __future__ import annotations

import getpass
import json
import sys
from pathlib import Path
from typing import Any

from tuner import job_context
from tuner.cli.tune_parser import options_from
from tuner.errors import TunerError, UsageError
from tuner.execution.task_shipping import data_file_of
from tuner.run.option_checks import option_fields
from tuner.run.options import TuneOptions
from tuner.run.plan import resolve
from tuner.run.task_file import check_task_file
from tuner.service import job_book
from tuner.service.client import (
    Service,
    entrypoint,
    is_space_file,
    job_request,
    job_tune_args,
    new_job_id,
)
from tuner.service.contract import JOB_KIND
from tuner.service.limits import ServiceLimits

# tune options that a job passes on as given (the rest -- run directory, tracking, Ray address,
# output -- are the service's business: ``Option.forwarded``).
_FORWARDED = [option for option in option_fields(TuneOptions) if option.option.forwarded]
FORWARDED = tuple(option.name for option in _FORWARDED)


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
    submitter = getpass.getuser()
    run_root, tune_args, user_flags, resumes, files = _what_runs(
        args, service, job_id, task_path, space_file, user_flags)
    limits = ServiceLimits.of(service.record)
    limits.check_size(files)
    limits.check_queued(service, submitter)
    metadata = {"precision_tuner": JOB_KIND, "task": task_path.name, "submitted_by": submitter,
                "flags": " ".join(user_flags) or "-", "flags_json": json.dumps(user_flags),
                "tune_args": json.dumps(tune_args), "run_root": run_root,
                "resumes": resumes or "-"}
    env_vars = {job_context.JOB_ID_ENV: job_id, job_context.SUBMITTER_ENV: submitter,
                job_context.FLAGS_ENV: json.dumps(user_flags),
                job_context.WORKER_CPUS_ENV: str(args.worker_cpus),
                job_book.JOB_ROOT_ENV: run_root,
                job_book.INTAKE_ENV: str(job_book.intake_root(Path(
                    service.record["service_dir"])) / job_id),
                "PYTHONUNBUFFERED": "1"}
    if resumes:
        env_vars[job_context.RESUMES_ENV] = resumes
    command = entrypoint(task_name=task_path.name, run_root=run_root,
                         tracking_uri=service.tracking_uri, tune_args=tune_args)
    request = job_request(job_id=job_id, entrypoint_command=command, metadata=metadata,
                          env_vars=env_vars)
    _send(service, job_id, files, request)
    print(job_id)
    print(f"submitted {task_path.name} as job {job_id}"
          + (f" (resuming {resumes})" if resumes else "")
          + f"; watch it: precision-tuner status {job_id} / logs {job_id} --follow",
          file=sys.stderr)
    return 0


def _what_runs(args, service: Service, job_id: str, task_path: Path, space_file: Path | None,
               user_flags: list[str]) -> tuple[str, list[str], list[str], str, list[Path]]:
    """The job's run root, tune arguments, flags, the job it resumes ("" for none) and the
    files it sends: a new run's, or for ``--resume JOB`` that job's own (its files are in
    its run root already)."""
    if args.resume_job:
        old = service.recorded_job(args.resume_job)
        if old["task"] != task_path.name:
            raise UsageError(f"--resume {args.resume_job} tuned {old['task']!r}, not "
                             f"{task_path.name!r}. Pass that task file.")
        _check_resumable(service, args.resume_job, old)
        return old["run_root"], old["tune_args"], old["flags"], args.resume_job, []
    run_root = f"{service.record['service_dir']}/jobs/{job_id}"
    data = data_file_of(task_path, task_path.read_text())  # tune()'s objects, beside the task
    return (run_root, job_tune_args(user_flags, run_root), user_flags, "",
            [path for path in (task_path, space_file, data) if path])


def _check_resumable(service: Service, job_id: str, old: dict[str, Any]) -> None:
    """A job resumes once at a time: not while it runs or waits, nor while another job that
    resumes it does (two drivers must never write one run)."""
    if old["running"]:
        state = "queued, waiting for its turn" if old["status"] == "PENDING" else old["status"]
        raise UsageError(f"--resume {job_id}: that job is still {state}. Stop it first "
                         f"(`precision-tuner stop {job_id}`), or let it run.")
    for other in service.server.jobs():
        meta = other.get("metadata") or {}
        if meta.get("precision_tuner") == JOB_KIND and meta.get("run_root") == old["run_root"] \
                and other.get("status") in ("PENDING", "RUNNING"):
            raise UsageError(f"--resume {job_id}: job {other.get('submission_id')} already "
                             f"resumes it ({other.get('status').lower()}). Watch that one "
                             f"(`precision-tuner status {other.get('submission_id')}`), or "
                             "stop it first.")


def _send(service: Service, job_id: str, files: list[Path], request: dict) -> None:
    """The job's files and submission into the service's book, then the job to Ray: it is on
    the service's disk before it is in Ray's queue, so a head killed from then on loses
    nothing (tuner.service.job_book). Where Ray does not take it, it leaves the book too."""
    for path in files:
        service.intake.put_file(job_book.artifact_path(job_id, path.name), path)
    service.intake.put_text(job_book.artifact_path(job_id, job_book.SUBMISSION),
                            job_book.submission_record(request))
    try:
        service.server.submit(request)
    except BaseException:
        _withdraw(service, job_id)
        raise


def _withdraw(service: Service, job_id: str) -> None:
    """The job Ray did not take leaves the book too, so that no restart queues it."""
    try:
        service.intake.put_text(job_book.artifact_path(job_id, job_book.STOP_REQUESTED),
                                "withdrawn: the job server did not take it\n")
    except TunerError:
        pass
