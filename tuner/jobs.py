"""The job commands: ``submit``, ``jobs``, ``status``, ``logs``, ``stop``, ``fetch``.

A job is a Ray job (``ray.job_submission.JobSubmissionClient``) whose entrypoint is
``precision-tuner tune`` on the service's cluster, logging to the service's MLflow server.
Ray's job server is the queue and the front door; MLflow holds the results, so ``fetch``
works after the job ended and from any machine that can reach the service.

Where things are:

- the service's MLflow address and directory: the metadata of the Ray job
  ``precision-tuner-service`` that ``service start`` leaves behind (``service_record``);
- a job's task, flags, submitter and run directory: the Ray job's metadata;
- a job's trials and exported config: its MLflow parent run, tagged ``precision_tuner.job_id``
  (and ``precision_tuner.job_ids``, every job that worked on the run).
"""

from __future__ import annotations

import datetime
import getpass
import json
import os
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuner import job_context
from tuner.errors import UsageError, first_line

SERVICE_ENV = "PRECISION_TUNER_SERVICE"
TOKEN_ENV = "PRECISION_TUNER_TOKEN"
JOB_KIND = "job"

# tune flags that a job passes on as given (the rest -- run directory, tracking, Ray address,
# output -- are the service's business).
FORWARDED = ("space", "trials", "exhaustive", "steps", "seed", "tolerance", "time_limit",
             "workers", "finalists", "min_gain", "objective", "memory_slack",
             "keep_slow_policies", "trial_seconds", "confirm_steps", "confirm_seconds",
             "no_confirm")


# -- connecting ----------------------------------------------------------------------------
def service_address(args) -> str:
    address = getattr(args, "service", None) or os.environ.get(SERVICE_ENV)
    if not address:
        raise UsageError(f"no service address: pass --service http://HOST:8265 or set "
                         f"{SERVICE_ENV} (`precision-tuner service start` prints it)")
    if "://" not in address:
        address = f"http://{address}"
    return address.rstrip("/")


def service_token(args) -> str | None:
    token_file = getattr(args, "token_file", None)
    if token_file is not None:
        try:
            return Path(token_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {str(token_file)!r}: "
                             f"{exc.strerror or exc}. Pass the service's auth_token file.") \
                from None
    return os.environ.get(TOKEN_ENV) or None


def client_for(address: str, token: str | None):
    """A ``JobSubmissionClient`` for the service, with the bearer token when there is one."""
    import logging

    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    for name in ("ray", "ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.WARNING)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        return JobSubmissionClient(address, headers=headers)
    except AuthenticationError as exc:
        raise UsageError(_refused(address, exc, token)) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UsageError(f"cannot reach the service at --service {address}: {first_line(exc)}."
                         " Start it (`precision-tuner service start`) or fix the address.") \
            from None


def _refused(address: str, exc: BaseException, token: str | None) -> str:
    why = "the token was not accepted" if token else "it requires authentication"
    return (f"the service at --service {address} refused the request: {why} "
            f"({first_line(exc, 80)}). Set {TOKEN_ENV} to the service's token, or pass "
            "--token-file DIR/auth_token")


class Service:
    """One connection to the service: Ray's job client and the MLflow client."""

    def __init__(self, args) -> None:
        self.address = service_address(args)
        self.token = service_token(args)
        self.jobs = client_for(self.address, self.token)
        self.record = self._record()
        self.tracking_uri = getattr(args, "tracking_uri", None) or self.record["tracking_uri"]
        self._mlflow = None

    def _record(self) -> dict[str, str]:
        from tuner.service import RECORD_JOB

        try:
            info = self.jobs.get_job_info(RECORD_JOB)
        except Exception as exc:  # noqa: BLE001 - Ray raises RuntimeError for "not found"
            raise UsageError(f"{self.address} is a Ray job server but not a precision-tuner "
                             f"service ({first_line(exc, 80)}). Start one with "
                             "`precision-tuner service start`.") from None
        return dict(info.metadata or {})

    @property
    def mlflow(self):
        if self._mlflow is None:
            import logging

            if self.token and not os.environ.get("MLFLOW_TRACKING_PASSWORD"):
                from tuner.service import MLFLOW_USER

                os.environ["MLFLOW_TRACKING_USERNAME"] = MLFLOW_USER
                os.environ["MLFLOW_TRACKING_PASSWORD"] = self.token
            from mlflow import MlflowClient

            for name in ("mlflow", "alembic"):
                logging.getLogger(name).setLevel(logging.WARNING)
            self._mlflow = MlflowClient(self.tracking_uri)
        return self._mlflow

    def job(self, job_id: str, required: bool = True):
        """The Ray job ``job_id``, which must be one of this service's tuning jobs (or None,
        when not ``required``: Ray forgets its jobs when the cluster restarts; MLflow keeps
        their runs)."""
        try:
            info = self.jobs.get_job_info(job_id)
        except Exception:  # noqa: BLE001 - Ray raises RuntimeError for an unknown id
            info = None
        if info is None or (info.metadata or {}).get("precision_tuner") != JOB_KIND:
            if not required:
                return None
            raise UsageError(f"no tuning job {job_id!r} on the service at {self.address}. "
                             "List the jobs with `precision-tuner jobs`.")
        return info

    def recorded_job(self, job_id: str) -> dict[str, Any]:
        """What a resubmission needs of ``job_id``: from the Ray job, or, after the cluster
        restarted, from its MLflow parent run (then tune's unrecorded flags -- workers, time
        limit, finalists -- fall back to their defaults)."""
        info = self.job(job_id, required=False)
        if info is not None:
            meta = info.metadata
            return {"task": meta.get("task"), "run_root": meta["run_root"],
                    "tune_args": json.loads(meta["tune_args"]),
                    "flags": json.loads(meta.get("flags_json", "[]")),
                    "running": not info.status.is_terminal(), "status": info.status.value}
        parent = self.parent_run(job_id)
        if parent is None or not parent.data.tags.get("run_dir"):
            raise UsageError(f"no tuning job {job_id!r} on the service at {self.address}, "
                             "neither in Ray nor in MLflow. List the jobs with "
                             "`precision-tuner jobs`.")
        flags = parent.data.tags.get(job_context.TAG_PREFIX + "flags", "-")
        return {"task": Path(parent.data.params.get("task", "?")).name,
                "run_root": str(Path(parent.data.tags["run_dir"]).parent), "tune_args": [],
                "flags": [] if flags == "-" else flags.split(),
                "running": False, "status": parent.info.status}

    def tuning_jobs(self) -> list:
        jobs = [j for j in self.jobs.list_jobs()
                if (j.metadata or {}).get("precision_tuner") == JOB_KIND]
        return sorted(jobs, key=lambda j: j.start_time or 0)

    def parent_run(self, job_id: str):
        """The MLflow parent run that ``job_id`` worked on (None before the job opened it)."""
        experiments = [e.experiment_id for e in self.mlflow.search_experiments(
            filter_string="name LIKE 'precision-tuner/%'")]
        if not experiments:
            return None
        runs = self.mlflow.search_runs(
            experiments, filter_string=f"tags.`{job_context.JOB_IDS_TAG}` LIKE '%{job_id}%'",
            max_results=10)
        runs = [r for r in runs if job_id in
                r.data.tags.get(job_context.JOB_IDS_TAG, "").split(",")]
        return runs[0] if runs else None

    def progress(self, job_id: str) -> dict[str, Any]:
        """Trials done, the planned number, the best so far and what the job is doing."""
        parent = self.parent_run(job_id)
        if parent is None:
            return {"done": 0, "planned": None, "best": None, "phase": None, "parent": None}
        children = self.mlflow.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'", max_results=1000)
        done = [r for r in children if r.info.status in ("FINISHED", "FAILED")]
        stable = [r for r in done if r.data.tags.get("verdict") == "stable"
                  and r.data.metrics.get("speedup_vs_float32") is not None
                  and r.data.tags.get("trial_number") != "0"]
        best = None
        if parent.data.tags.get("best_config"):
            speedup = parent.data.metrics.get("best_speedup_vs_float32")
            best = parent.data.tags["best_config"] + (f" {speedup:.2f}x" if speedup else "")
        elif stable:
            top = max(stable, key=lambda r: r.data.metrics["speedup_vs_float32"])
            best = (f"#{top.data.tags.get('trial_number')} "
                    f"{top.data.metrics['speedup_vs_float32']:.2f}x ~")
        # The plan's budget; once finished, the trials that ran (a small space runs out first).
        planned = parent.data.metrics.get("trials") or parent.data.params.get("trials")
        return {"done": len(done), "planned": int(float(planned)) if planned else None,
                "best": best,
                "phase": parent.data.tags.get(job_context.PHASE_TAG), "parent": parent}


# -- submit --------------------------------------------------------------------------------
def forwarded_flags(args, parser_defaults: dict[str, Any], options: dict[str, str]) -> list[str]:
    """The tune flags the user gave, as command-line words (defaults left out)."""
    words: list[str] = []
    for dest in FORWARDED:
        value = getattr(args, dest, None)
        if value is None or value is False or value == parser_defaults.get(dest):
            continue
        words.append(options[dest])
        if value is not True:
            words.append(str(value))
    return words


def check_submission(args) -> tuple[Path, Path | None]:
    """Everything ``tune`` would refuse, refused here, before anything is sent: the same
    one-line messages, exit code 2. Returns the task file and the space file (if a file)."""
    import argparse

    from tuner.cli import _flags
    from tuner.plan import resolve
    from tuner.task_file import check_task_file

    task_path = check_task_file(args.task)
    if args.resume_job:
        return task_path, None
    # The very flags tune would resolve (the run directory and tracking are the service's).
    resolve(_flags(argparse.Namespace(**{**vars(args), "run_dir": Path("."),
                                         "tracking_uri": None}), task_path), None)
    space_file = None
    if args.space and (args.space.endswith((".yaml", ".yml")) or os.sep in args.space):
        space_file = Path(args.space).resolve()
    return task_path, space_file


def new_job_id(task_path: Path) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{task_path.stem}-{stamp}-{secrets.token_hex(2)}"


def entrypoint(*, task_name: str, space_name: str | None, run_root: str, tracking_uri: str,
               tune_args: list[str], resume: bool) -> str:
    """The shell command the job runs on the cluster: copy the job's files next to its run
    directory (so a resubmission finds them at the same path), then ``precision-tuner tune``
    (``exec``: Ray's stop signal reaches tune itself)."""
    quote = shlex.quote
    task_dir = f"{run_root}/task"
    steps = []
    if not resume:
        files = " ".join(quote(name) for name in (task_name, space_name) if name)
        steps.append(f"mkdir -p {quote(task_dir)} && cp {files} {quote(task_dir)}/")
    words = ["exec", "precision-tuner", "tune", f"{task_dir}/{task_name}", *tune_args,
             "--run-dir", f"{run_root}/run", "--ray-address", "auto",
             "--tracking-uri", tracking_uri, "--out", f"{run_root}/best_precision.json",
             "--force"]
    if resume:
        words.append("--resume")
    steps.append(" ".join(quote(word) for word in words))
    return " && ".join(steps)


def submit(args, parser_defaults: dict[str, Any], options: dict[str, str]) -> int:
    task_path, space_file = check_submission(args)
    user_flags = forwarded_flags(args, parser_defaults, options)
    if args.resume_job and user_flags:
        raise UsageError(f"--resume {args.resume_job} continues that job with its own flags; "
                         f"drop {' '.join(user_flags)}")
    service = Service(args)
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
        tune_args = list(user_flags)
        if space_file is not None:
            index = tune_args.index("--space")
            tune_args[index + 1] = f"{run_root}/task/{space_file.name}"
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
    with tempfile.TemporaryDirectory(prefix="precision-tuner-job-") as package:
        shutil.copy(task_path, Path(package) / task_path.name)
        if space_file is not None:
            shutil.copy(space_file, Path(package) / space_file.name)
        command = entrypoint(task_name=task_path.name,
                             space_name=space_file.name if space_file else None,
                             run_root=run_root, tracking_uri=service.tracking_uri,
                             tune_args=tune_args, resume=bool(resumes))
        service.jobs.submit_job(entrypoint=command, submission_id=job_id, metadata=metadata,
                                runtime_env={"working_dir": package, "env_vars": env_vars})
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
    except Exception:  # noqa: BLE001
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
    from tuner.config import PrecisionConfig

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

    from tuner.tracking import TRIALS_QUERY

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

