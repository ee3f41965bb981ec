"""The service's client: the address and token, the Ray job client, the ``Service`` view of
the cluster's jobs and MLflow server, and what a submitted job runs (``entrypoint``). The
commands that use it (``submit``, ``jobs``, ``status``, ...) are in tuner.cli.jobs.

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
import functools
import json
import os
import secrets
import shlex
from pathlib import Path
from typing import Any

from tuner import job_context
from tuner.errors import ServiceOutage, UsageError, first_line
from tuner.service import job_book
from tuner.service.contract import (
    JOB_KIND,
    MLFLOW_USER,
    RECORD_JOB,
    SERVICE_ENV,
    TOKEN_ENV,
    client_for,
)
from tuner.service.intake import Intake
from tuner.service.job_server import JobServer


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


class Service:
    """One connection to the service: its job server (over REST, tuner.service.job_server),
    Ray's job client (``jobs``, imported on first use) and the MLflow client."""

    def __init__(self, args) -> None:
        self.address = service_address(args)
        self.token = service_token(args)
        self.server = JobServer(self.address, self.token)
        self.record = self._record()
        self.tracking_uri = getattr(args, "tracking_uri", None) or self.record["tracking_uri"]
        self._mlflow = None

    @functools.cached_property
    def jobs(self):
        """Ray's ``JobSubmissionClient`` for the service (its import takes most of a second,
        so only the commands that use it pay it)."""
        return client_for(self.address, self.token)

    def _record(self) -> dict[str, str]:
        info = self.server.job(RECORD_JOB)
        if info is None:
            raise UsageError(f"{self.address} is a Ray job server but not a precision-tuner "
                             f"service (it has no job {RECORD_JOB!r}). Start one with "
                             "`precision-tuner service start`.")
        return dict(info.get("metadata") or {})

    @property
    def mlflow(self):
        if self._mlflow is None:
            import logging

            if self.token and not os.environ.get("MLFLOW_TRACKING_PASSWORD"):
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
        info = self.job_info(job_id)
        if info is None or (info.metadata or {}).get("precision_tuner") != JOB_KIND:
            if not required:
                return None
            raise UsageError(f"no tuning job {job_id!r} on the service at {self.address}. "
                             "List the jobs with `precision-tuner jobs`.")
        return info

    def job_info(self, job_id: str):
        """Ray's answer about ``job_id``: its details, or None where Ray says it has no such
        job (HTTP 404, "does not exist": it never had it, or forgot it in a restart). Any other
        failure (a timeout, a refused token, a dropped connection) is an outage, raised as
        ``ServiceOutage``: it says nothing about the job."""
        try:
            return self.jobs.get_job_info(job_id)
        except Exception as exc:  # noqa: BLE001 - Ray's SDK raises RuntimeError for both
            if isinstance(exc, RuntimeError) and "does not exist" in str(exc):
                return None
            raise ServiceOutage(f"the job server at {self.address} did not answer about job "
                                f"{job_id!r} ({type(exc).__name__}: {first_line(exc, 200)}). "
                                "Check that the service is up (`precision-tuner service "
                                "status`) and retry.") from None

    def recorded_job(self, job_id: str) -> dict[str, Any]:
        """What a resubmission needs of ``job_id``: from the Ray job, or, after the cluster
        restarted, from its MLflow parent run (the flags it was submitted with, so a resumed
        job keeps its workers, time limit and finalists, and its space file's copy)."""
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
        tag = parent.data.tags.get(job_context.TAG_PREFIX + "flags", "-")
        flags = [] if tag == "-" else tag.split()
        run_root = str(Path(parent.data.tags["run_dir"]).parent)
        return {"task": Path(parent.data.params.get("task", "?")).name,
                "run_root": run_root, "tune_args": job_tune_args(flags, run_root),
                "flags": flags, "running": False, "status": parent.info.status}

    def close_orphans(self) -> list[str]:
        """Close the records no job is left to close: a parent run still RUNNING in MLflow
        whose job's driver is gone (Ray says the job ended, or forgot it when the cluster
        restarted) ends as KILLED where the job was stopped, else FAILED, with its running
        trials KILLED and the reason in a tag. One line per run closed. A job server that does
        not answer about a job (``job_info``: an outage, not an unknown job) closes nothing,
        and the one line returned says so."""
        experiments = [e.experiment_id for e in self.mlflow.search_experiments(
            filter_string="name LIKE 'precision-tuner/%'")]
        if not experiments:
            return []
        orphans = []
        for parent in self.mlflow.search_runs(
                experiments, filter_string="attributes.status = 'RUNNING'", max_results=500):
            job_id = parent.data.tags.get(job_context.JOB_ID_TAG)
            if not job_id or parent.data.tags.get("mlflow.parentRunId"):
                continue                 # not a service job's parent run
            try:
                info = self.job(job_id, required=False)
            except ServiceOutage as outage:  # decide nothing on it: close nothing
                return [f"not closing any job's MLflow runs: {outage}"]
            if info is not None and not info.status.is_terminal():
                continue                 # still running: it closes its own records
            orphans.append((job_id, parent, info))
        closed = []
        for job_id, parent, info in orphans:
            status, why = ("FAILED", "the cluster no longer knows the job (it restarted "
                                     "while the job ran)") if info is None else \
                ("KILLED" if info.status.value == "STOPPED" else "FAILED",
                 f"its driver ended ({info.status.value}) without closing its records")
            run_id = parent.info.run_id
            for child in self.mlflow.search_runs(
                    [parent.info.experiment_id], max_results=1000,
                    filter_string=f"tags.`mlflow.parentRunId` = '{run_id}' and "
                                  "attributes.status = 'RUNNING'"):
                self.mlflow.set_terminated(child.info.run_id, status="KILLED")
            self.mlflow.set_tag(run_id, job_context.TAG_PREFIX + "closed_because", why)
            self.mlflow.set_terminated(run_id, status=status)
            closed.append(f"closed job {job_id}'s MLflow run as {status}: {why}")
        return closed

    @functools.cached_property
    def intake(self) -> Intake:
        """The service's book, through its MLflow server (tuner.service.intake)."""
        return Intake(self.tracking_uri, self.token)

    def stop_requested(self, job_id: str) -> bool:
        """A user stopped the job (it may still be PENDING in Ray until its turn comes, when
        its entrypoint ends at once without starting it)."""
        folder = job_book.artifact_path(job_id, "").rstrip("/")
        return job_book.STOP_REQUESTED in self.intake.names(folder)

    def queue(self, jobs: list | None = None) -> list:
        """The jobs waiting for a turn, first in line first (Ray starts them in the order
        they came), those stopped while they waited left out."""
        jobs = self.tuning_jobs() if jobs is None else jobs
        return [job for job in jobs if job.status.value == "PENDING"
                and not self.stop_requested(job.submission_id)]

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


# -- what a job runs -------------------------------------------------------------------
def new_job_id(task_path: Path) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{task_path.stem}-{stamp}-{secrets.token_hex(2)}"


def is_space_file(space: str | None) -> bool:
    """Does ``--space`` name a YAML file (shipped with the job) rather than a built-in space?"""
    return bool(space) and (space.endswith((".yaml", ".yml")) or os.sep in space)


def job_tune_args(flags: list[str], run_root: str) -> list[str]:
    """The tune arguments a job runs with: the user's flags, a space file's path pointing at
    the job's own copy (``entrypoint`` puts it in RUN_ROOT/task)."""
    words = list(flags)
    if "--space" in words[:-1]:
        index = words.index("--space") + 1
        if is_space_file(words[index]):
            words[index] = f"{run_root}/task/{Path(words[index]).name}"
    return words


def entrypoint(*, task_name: str, run_root: str, tracking_uri: str,
               tune_args: list[str]) -> str:
    """The shell command the job runs on the cluster once its turn comes:
    ``precision-tuner tune`` through tuner.cli.handoff (``exec``: Ray's stop signal reaches
    it), which copies the job's files from the service's book into RUN_ROOT/task, resumes the
    run where it had begun (a job queued again after a restart, or ``submit --resume``), and
    runs it in one of the service's spare drivers where one is ready."""
    words = ["exec", "python", "-m", "tuner.cli.handoff", "tune",
             f"{run_root}/task/{task_name}", *tune_args,
             "--run-dir", f"{run_root}/run", "--ray-address", "auto",
             "--tracking-uri", tracking_uri, "--out", f"{run_root}/best_precision.json",
             "--force"]
    return " ".join(shlex.quote(word) for word in words)


def job_request(*, job_id: str, entrypoint_command: str, metadata: dict[str, str],
                env_vars: dict[str, str]) -> dict:
    """What Ray's job server is sent for a job (and what the service's book keeps, to send
    it again after a restart): the job asks for one of the head's job turns, so that beyond
    them it waits in Ray's queue without a process."""
    return {"entrypoint": entrypoint_command, "submission_id": job_id, "metadata": metadata,
            "runtime_env": {"env_vars": env_vars},
            "entrypoint_resources": {job_book.TURN: 1}}
