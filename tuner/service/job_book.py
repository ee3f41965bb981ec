"""The service's book of jobs, on the head's disk: what outlives ``service stop`` and a killed
Ray head.

While the cluster lives, Ray's job server is the queue: every tuning job asks for one of the
head's job turns (the custom resource ``TURN``, as many as the service runs jobs at once), so a
job beyond them waits PENDING as an actor not yet placed, holding no process, and Ray starts
the waiting ones in the order they came. Ray forgets its jobs when its head restarts; this
book is how ``service start`` puts back, in their order, the jobs that had not ended.

Where things are (``DIR``: the service directory)::

    DIR/mlflow/artifacts/queue/JOB/      the job's page in the book:
        job.json          the submission as Ray was sent it, and when
        FILES             the task (and its data, its space file)
        stop_requested    a user stopped the job (or Ray never took it)
        outcome.json      how its driver ended: succeeded, failed or interrupted (Ctrl-C,
                          Ray's stop, service stop)
        driver.pid        the entrypoint's process while it runs
    RUN_ROOT/run/run.json   the job's run has begun (a resubmission resumes it); RUN_ROOT is
                            DIR/jobs/JOB, or the resumed job's for ``submit --resume``
    DIR/draining            ``service stop`` is stopping the jobs: a job whose turn comes
                            now does not start

``submit`` writes the submission, the files and a stop through MLflow's artifact proxy (the
service's own MLflow server writes them under its artifact root: tuner.service.intake), the
submission before it sends the job to Ray, so a job is on disk before it is in any queue. The
job's entrypoint (tuner.cli.handoff) writes the rest. Plain files, the standard library and
the service's record (tuner.service.service_info, for whether a process lives): the entrypoint
reads this on every job's start-up path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tuner.service.service_info import SERVICE_FILE, alive

INTAKE = "queue"                       # under MLflow's artifact root: the submissions
SUBMISSION = "job.json"
STOP_REQUESTED = "stop_requested"
OUTCOME = "outcome.json"
DRIVER_PID = "driver.pid"
DRAINING = "draining"
TURN = "precision_tuner_job"           # the head's custom resource: one per job running
# Ray fails a job still PENDING after RAY_JOB_START_TIMEOUT_SECONDS (15 min by default); a
# queued job waits its turn however long the queue is.
START_TIMEOUT_S = str(10 * 365 * 24 * 3600)
# Environment of a job's entrypoint: its folder in the book and its submission's.
JOB_ROOT_ENV = "PRECISION_TUNER_JOB_ROOT"
INTAKE_ENV = "PRECISION_TUNER_INTAKE"
INTERRUPTED_RC = 130                   # tune's exit status on SIGINT (Ray's stop signal here)


def intake_root(service_dir: Path) -> Path:
    return Path(service_dir) / "mlflow" / "artifacts" / INTAKE


def artifact_path(job_id: str, name: str) -> str:
    """Where ``submit`` puts a job's file, relative to MLflow's artifact root."""
    return f"{INTAKE}/{job_id}/{name}"


def outcome_of(rc: int) -> str:
    if rc == 0:
        return "succeeded"
    return "interrupted" if rc in (INTERRUPTED_RC, -signal.SIGINT, -signal.SIGTERM) else "failed"


@dataclass
class BookedJob:
    """One job in the book: its submission (``request``: what was posted to Ray's job
    server) and where its entrypoint writes."""

    job_id: str
    intake: Path
    root: Path
    request: dict
    submitted_at: float

    @property
    def stop_requested(self) -> bool:
        return (self.intake / STOP_REQUESTED).exists()

    @property
    def started(self) -> bool:
        """Its run has begun: a resubmission resumes it from its finished trials."""
        return (self.root / "run" / "run.json").is_file()

    def outcome(self) -> dict | None:
        try:
            return json.loads((self.intake / OUTCOME).read_text())
        except (OSError, ValueError):
            return None

    @property
    def unfinished(self) -> bool:
        """Neither ended (succeeded, failed) nor stopped by a user: ``service start`` queues it
        again. A job interrupted by ``service stop`` or killed with the head is unfinished."""
        if self.stop_requested:
            return False
        outcome = self.outcome()
        return outcome is None or outcome.get("outcome") == "interrupted"


def read(service_dir: Path) -> list[BookedJob]:
    """Every job in the book, in submission order (a job whose submission cannot be read,
    half-written by a submit that was cut off, is left out: Ray never saw it)."""
    book = intake_root(service_dir)
    jobs = []
    for folder in sorted(book.iterdir()) if book.is_dir() else []:
        try:
            record = json.loads((folder / SUBMISSION).read_text())
            request = record["request"]
            run_root = request["runtime_env"]["env_vars"][JOB_ROOT_ENV]
            jobs.append(BookedJob(job_id=folder.name, intake=folder, root=Path(run_root),
                                  request=request,
                                  submitted_at=float(record["submitted_at"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(jobs, key=lambda job: job.submitted_at)


def to_queue_again(service_dir: Path) -> list[BookedJob]:
    """The unfinished jobs, in the order they go back into the queue: those that had started
    first (they held turns), then the waiting ones in the order they were submitted."""
    unfinished = [job for job in read(service_dir) if job.unfinished]
    return sorted(unfinished, key=lambda job: (not job.started, job.submitted_at))


def queue_again(service_dir: Path, server) -> list[str]:
    """The jobs the book holds unfinished (queued or running when the service stopped or its
    head died) sent to Ray's queue again through ``server`` (tuner.service.job_server's
    ``JobServer``), in their order, under their own ids; a driver of theirs still alive is
    ended first. One line each, for ``service start`` to say."""
    jobs = to_queue_again(service_dir)
    if not jobs:
        return []
    lines = [f"  queued again {len(jobs)} job(s) the service had not finished, in their "
             "order:"]
    for job in jobs:
        ended = end_leftover_driver(job)
        try:
            server.submit(job.request)
        except Exception as exc:  # noqa: BLE001 - one job refused does not hold the rest
            lines.append(f"    {job.job_id}: not queued again ({str(exc)[:160]}); submit "
                         "it again")
            continue
        lines.append(f"    {job.job_id}: " + ("resumes its run" if job.started
                                              else "waits its turn")
                     + ("; its driver left from before was ended" if ended else ""))
    return lines


def submission_record(request: dict) -> str:
    return json.dumps({"request": request, "submitted_at": time.time()}, indent=1) + "\n"


# -- the entrypoint's side (tuner.cli.handoff) ----------------------------------------------
@dataclass
class RunningJob:
    """The job this entrypoint runs, from its environment (None outside the service)."""

    root: Path
    intake: Path

    @classmethod
    def from_environment(cls) -> RunningJob | None:
        root, intake = os.environ.get(JOB_ROOT_ENV), os.environ.get(INTAKE_ENV)
        if not root or not intake:
            return None
        return cls(Path(root), Path(intake))

    @property
    def service_dir(self) -> Path:
        return self.intake.parent.parent.parent.parent     # DIR/mlflow/artifacts/queue/JOB

    def why_not_start(self) -> str | None:
        """A reason not to start at all: stopped while it waited, or the service stopping."""
        if (self.intake / STOP_REQUESTED).exists():
            return "stopped by a user while it was queued"
        if (self.service_dir / DRAINING).exists():
            return "the service is stopping; it is queued again when the service starts"
        return None

    def prepare(self) -> bool:
        """The task's files in ROOT/task (copied from the submission where missing); True
        when the job's run has begun before, so that ``tune`` resumes it."""
        task = self.root / "task"
        task.mkdir(parents=True, exist_ok=True)
        for source in sorted(self.intake.iterdir()) if self.intake.is_dir() else []:
            if source.name in (SUBMISSION, STOP_REQUESTED, OUTCOME, DRIVER_PID) \
                    or source.name.startswith(".") or not source.is_file():
                continue
            if not (task / source.name).exists():
                shutil.copyfile(source, task / source.name)
        (self.intake / DRIVER_PID).write_text(f"{os.getpid()}\n")
        return (self.root / "run" / "run.json").is_file()

    def head_alive(self) -> bool:
        """Is the service's Ray head (``service.json``'s ``ray_pid``) still running? A driver
        that fails as the head dies under it (Ray 2.40's exits at once) has not failed."""
        try:
            pid = int(json.loads((self.service_dir / SERVICE_FILE).read_text())["ray_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return alive(pid)

    def ended(self, rc: int) -> None:
        outcome = {"outcome": outcome_of(rc), "rc": rc, "ended_at": time.time()}
        if outcome["outcome"] == "failed" and not self.head_alive():
            outcome.update(outcome="interrupted", why="the service's Ray head ended under it")
        path = self.intake / OUTCOME
        temporary = path.with_name(f".{OUTCOME}.{os.getpid()}")
        temporary.write_text(json.dumps(outcome) + "\n")
        os.replace(temporary, path)
        (self.intake / DRIVER_PID).unlink(missing_ok=True)


def end_leftover_driver(job: BookedJob) -> bool:
    """A driver of ``job`` still alive from before a killed head (Ray starts an entrypoint in
    a session of its own, so it outlives the head's processes) ends with its whole session
    before the job is queued again: two drivers must never write one run. True if one was
    ended."""
    try:
        pid = int((job.intake / DRIVER_PID).read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    if b"tuner.cli.handoff" not in command:   # the pid was taken by another process since
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.2)
        if not alive(pid):
            break
    (job.intake / DRIVER_PID).unlink(missing_ok=True)
    return True
