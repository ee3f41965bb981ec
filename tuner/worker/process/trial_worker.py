"""The worker's one face: ``TrialWorker``, what either executor asks of a worker process.

A Ray actor is a ``TrialWorker`` (tuner.execution.ray_actor: sized to its share of the node,
named by its node); the local executor's worker program serves one (tuner.worker.programs.serve:
every core, this host's name) and the driver calls its methods by name
(tuner.execution.local_worker). Both call the same methods with the same arguments: check the
task (``check_task``), diagnose it (``diagnose``), run a trial (``run``), run a live model
again (``run_live``), keep or drop live models (``keep_live_only``, ``release_live``), say
what memory it holds and has left (``memory``), forget
a finished job (``forget``), time the device's ceiling (``prime_ceiling``) and, in a fresh
process, a trial with the process's peak memory (``run_for_peak_rss``). A task the driver
shipped through Ray's object store (``shipped``) is fetched first; None is a task file on this
machine. Plain data in and out; everything here runs inside the TensorFlow process, and
importing it imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import os
import socket

from tuner.worker.check.task_check import check_task
from tuner.worker.device.ceiling import prime
from tuner.worker.device.room import device_room, mark_ready, rss_bytes
from tuner.worker.process.startup import prepare_process
from tuner.worker.trial.live import run_live
from tuner.worker.trial.live_models import keep_only, release
from tuner.worker.trial.steps import forget_stacked
from tuner.worker.trial.trial import run_trial


class TrialWorker:
    """One long-lived worker process: TensorFlow imported once, reused across trials. ``node``
    names where it runs (recorded with every result; by default this host's name, as a trial
    records it)."""

    def __init__(self, threads: int | None, use_gpu: bool, node: str | None = None) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.devices = prepare_process(threads, use_gpu)   # before anything else: see there
        mark_ready()
        self._node = socket.gethostname() if node is None else node

    def node(self) -> str:
        return self._node

    def prime_ceiling(self) -> float:
        return prime()

    def check_task(self, task_path: str, shipped: dict | None, steps: int,
                   patterns: list[str], ceiling: bool, diagnose_steps: int) -> dict:
        from tuner.worker.task.task_loader import task_file_here  # numpy at import

        self._receive(task_path, shipped)
        return check_task(task_file_here(task_path), steps, patterns, ceiling, diagnose_steps)

    def diagnose(self, task_path: str, shipped: dict | None, steps: int) -> dict:
        from tuner.worker.diagnostics.diagnose import diagnose_task  # numpy at import
        from tuner.worker.task.task_loader import task_file_here

        self._receive(task_path, shipped)
        return diagnose_task(task_file_here(task_path), steps)

    def run(self, spec_dict: dict) -> dict:
        return {**run_trial(self._received(spec_dict)), "node": self._node}

    def run_live(self, spec_dict: dict) -> dict:
        return {**run_live(self._received(spec_dict)), "node": self._node}

    def run_for_peak_rss(self, spec_dict: dict) -> dict:
        """A trial in this (fresh) process, then the process's peak resident memory."""
        import resource

        result = self.run(spec_dict)
        return {"result": result,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    def keep_live_only(self, spec_dicts: list) -> dict:
        """Keep only these specs' live models: how many are left, and this process's resident
        memory before and after (what dropping the others gave back)."""
        before = rss_bytes()
        left = keep_only(spec_dicts)
        return {"live": left, "rss_before": before, "rss_after": rss_bytes()}

    def memory(self) -> dict:
        """What this worker holds and what its device has free (tuner.worker.device.room)."""
        return device_room()

    def release_live(self) -> int:
        return release()

    def forget(self) -> int:
        """Between two jobs on a warm worker: no live model, task or batch of the last job is
        kept, and Keras's global state is fresh."""
        import gc

        import keras

        from tuner.worker.task.task_loader import forget_tasks  # numpy at import

        release()
        count = forget_tasks()
        forget_stacked()
        keras.backend.clear_session()
        gc.collect()
        return count

    @staticmethod
    def _receive(task_path: str, shipped: dict | None) -> None:
        """``shipped``: the task code's digest and, in a list so that Ray passes it unresolved,
        its object reference, with its data file's name and reference where the driver
        shipped one (tuner.execution.task_shipping); None where the task file is here."""
        if shipped is None:
            return
        import ray

        from tuner.worker.task.task_loader import receive_task  # numpy at import

        data = (shipped["data_name"], lambda: ray.get(shipped["data_ref"][0])) \
            if "data_name" in shipped else None
        receive_task(task_path, shipped["digest"], lambda: ray.get(shipped["ref"][0]), data)

    def _received(self, spec_dict: dict) -> dict:
        spec_dict = dict(spec_dict)
        self._receive(spec_dict["task_path"], spec_dict.pop("shipped", None))
        return spec_dict
