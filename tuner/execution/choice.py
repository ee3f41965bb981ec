"""Which executor a tune runs on, and how many workers (``choose``): Ray where trials run side
by side (``--workers`` above one, one worker per GPU on a machine with several), on a cluster
(``--ray-address``) or in the service; the local worker process where one trial runs at a time
on this machine, which is most tunes: there Ray buys nothing and costs its start (measured on a
2-core CPU: ``ray.init`` 4.0-4.3 s of a 7.0-8.2 s start-up, and 1.4 s to shut down).

Plain data and the GPU count from ``nvidia-smi`` (no TensorFlow, no Ray imported here).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tuner.errors import UsageError
from tuner.execution.gpus import visible_gpu_ids

AUTO = "auto"


@dataclass(frozen=True)
class ExecutorChoice:
    """``kind``: ``local`` or ``ray``; ``workers``: trials side by side (None: one per GPU of
    the cluster, counted once Ray is connected); ``why``: the reason, said at the start and
    recorded in run.json and MLflow."""

    kind: str
    workers: int | None
    why: str

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        count = "one worker per GPU" if self.workers is None else \
            f"{self.workers} worker{'s' if self.workers != 1 else ''}"
        where = "the local worker process" if self.kind == "local" else "Ray"
        return f"{count} on {where} ({self.why})"


def visible_gpus() -> int:
    """NVIDIA devices this machine gives its processes (tuner.execution.gpus: a MIG slice
    counts as one, ``CUDA_VISIBLE_DEVICES`` narrows them); 0 without ``nvidia-smi``."""
    return len(visible_gpu_ids())


def choose(executor: str, workers: int | str, ray_address: str | None, service_job: bool,
           gpus: int | None = None) -> ExecutorChoice:
    """The executor and worker count for ``--executor`` and ``--workers`` (each ``auto`` or
    given). ``gpus``: this machine's visible GPUs (counted where None and needed)."""
    here = ray_address is None
    if workers == AUTO:
        count = gpus if gpus is not None else visible_gpus() if here else 0
        chosen_workers: int | None = max(1, count) if here else None
        per_gpu = here and count > 1
    else:
        chosen_workers, per_gpu = int(workers), False
    if executor == "local":
        if (chosen_workers or 1) > 1 and workers != AUTO or not here:
            given = ([f"--workers {workers}"] if workers != AUTO else []) \
                + ([f"--ray-address {ray_address}"] if not here else [])
            raise UsageError("--workers and --ray-address need Ray. Received: --executor local "
                             f"{' '.join(given)}. Drop them, or pass --executor auto or ray.")
        return ExecutorChoice("local", 1, "--executor local")
    if executor == "ray":
        return ExecutorChoice("ray", chosen_workers, "--executor ray")
    if not here:
        return ExecutorChoice("ray", chosen_workers, "--ray-address: trials on the cluster")
    if service_job:
        return ExecutorChoice("ray", chosen_workers, "a service job: trials on its Ray cluster")
    if per_gpu:
        return ExecutorChoice("ray", chosen_workers,
                              f"{chosen_workers} GPUs: a worker on each, side by side")
    if chosen_workers and chosen_workers > 1:
        return ExecutorChoice("ray", chosen_workers,
                              f"--workers {chosen_workers}: trials side by side")
    return ExecutorChoice("local", 1, "one trial at a time on this machine: no Ray to start")
