"""What the service admits, set at ``service start`` and said in its record: how many jobs run
at once (its job turns), how large a job may be, how many jobs one submitter may have waiting.
``submit`` checks the last two before it sends anything; Ray's queue enforces the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.errors import UsageError
from tuner.service.contract import JOB_KIND

MIB = 1024 * 1024
DEFAULT_MAX_JOB_MIB = 512
DEFAULT_MAX_QUEUED = 32


def job_turns(*, cpus: int, warm_workers: int | None, gpus: int,
              asked: int | None = None) -> int:
    """How many jobs the service runs at once, from what its head has to run them on: each
    running job holds at least one warm worker (one per CPU unless ``--warm-workers`` says
    otherwise; without a pool, the CPUs a job's own workers take), and a job on a node with
    GPUs asks for all of them, so there one runs at a time. ``asked``: ``--max-running``."""
    if asked:
        return asked
    if gpus:
        return 1
    return max(1, warm_workers if warm_workers else cpus)


@dataclass(frozen=True)
class ServiceLimits:
    turns: int
    max_job_mib: int = DEFAULT_MAX_JOB_MIB
    max_queued_per_user: int = DEFAULT_MAX_QUEUED

    def record(self) -> dict[str, str]:
        return {"job_turns": str(self.turns), "max_job_mib": str(self.max_job_mib),
                "max_queued_per_user": str(self.max_queued_per_user)}

    @classmethod
    def of(cls, record: dict[str, str]) -> ServiceLimits:
        """The limits a service's record states (a service started before they existed:
        the defaults)."""
        def number(key: str, default: int) -> int:
            text = record.get(key, "")
            return int(text) if text.isdigit() else default

        return cls(turns=number("job_turns", 1),
                   max_job_mib=number("max_job_mib", DEFAULT_MAX_JOB_MIB),
                   max_queued_per_user=number("max_queued_per_user", DEFAULT_MAX_QUEUED))

    def check_size(self, files: list[Path]) -> None:
        """Refuse, before anything is sent, a job whose files pass ``max_job_mib``."""
        sizes = {path.name: path.stat().st_size for path in files}
        total = sum(sizes.values())
        if total <= self.max_job_mib * MIB:
            return
        largest = max(sizes, key=sizes.__getitem__)
        raise UsageError(
            f"the job's files are {total / MIB:.1f} MiB ({largest}: "
            f"{sizes[largest] / MIB:.1f} MiB), over this service's limit of "
            f"{self.max_job_mib} MiB a job (service start --max-job-mib). Put the data where "
            "the service's nodes can read it (a shared path) and load it from there in "
            "train_data(), or ask the service's owner to raise --max-job-mib.")

    def check_queued(self, service, submitter: str) -> None:
        """Refuse a job from ``submitter`` while they already have ``max_queued_per_user``
        jobs waiting (jobs stopped while they waited do not count)."""
        waiting = [job for job in service.server.jobs()
                   if (job.get("metadata") or {}).get("precision_tuner") == JOB_KIND
                   and job["metadata"].get("submitted_by") == submitter
                   and job.get("status") == "PENDING"]
        if len(waiting) < self.max_queued_per_user:
            return
        waiting = [job for job in waiting
                   if not service.stop_requested(job["submission_id"])]
        if len(waiting) >= self.max_queued_per_user:
            raise UsageError(
                f"{submitter} already has {len(waiting)} jobs queued on this service, its "
                f"limit a submitter (service start --max-queued-per-user "
                f"{self.max_queued_per_user}). Wait for some to start (`precision-tuner "
                "jobs`), or stop one (`precision-tuner stop JOB`).")
