"""The Ray actor that runs trials: a ``TrialWorker`` (tuner.worker.process.trial_worker, the
worker's one face, which the local worker program serves too) as a Ray actor, at normal
priority, knowing its node. Both the job's own pool (tuner.execution.ray_pool) and the
service's warm pool (tuner.execution.warm_pool) start these."""

from __future__ import annotations

import os

from tuner.worker.process.trial_worker import TrialWorker


def trial_actor_class():
    import ray

    @ray.remote(max_restarts=0, max_task_retries=0)
    class TrialActor(TrialWorker):
        """A ``TrialWorker`` as a Ray actor, at normal priority, named by its node."""

        def __init__(self, threads: int, use_gpu: bool) -> None:
            try:  # Ray starts workers at nice 15: any busy process would starve our timings.
                os.setpriority(os.PRIO_PROCESS, 0, 0)
            except OSError:
                pass
            context = ray.get_runtime_context()
            super().__init__(threads, use_gpu,
                             f"{ray.util.get_node_ip_address()}/{context.get_node_id()[:8]}")

    return TrialActor
