"""What a worker process is, for either executor: started once, then runs specs.

The local executor's worker program (tuner.worker.programs.serve) starts with ``start_local_worker`` (an
exit when its driver dies, the frameworks imported once); a Ray actor is a ``TrialWorker``
(tuner.execution.ray_pool wraps it in ``ray.remote``), which also sizes TensorFlow's thread
pools to its share of the node and turns on GPU memory growth. Everything here runs inside the
TensorFlow process; the driver only names these functions.
"""

from __future__ import annotations

import os
import threading
import time

from tuner.worker.device.ceiling import prime
from tuner.worker.trial.live import run_live
from tuner.worker.trial.live_models import keep_only, release
from tuner.worker.process.startup import import_frameworks
from tuner.worker.trial.trial import run_trial
from tuner.worker.check.task_check import check_task

# TensorFlow's C++ logging would otherwise flood the terminal from the worker.
WORKER_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}


def _exit_with_parent() -> None:
    """A worker whose driver was killed (SIGKILL leaves no time to clean up) exits too."""
    parent = os.getppid()
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def start_local_worker() -> None:
    """The local executor's worker program (tuner.worker.programs.serve), before its first request. Its
    stdout and stderr (TensorFlow and Keras chatter, user prints) are the worker log already."""
    os.environ.update(WORKER_ENV)
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    import warnings

    warnings.simplefilter("ignore")
    import_frameworks()  # pay the import once, before the first trial
    configure_devices(threads=None, use_gpu=True)


def configure_devices(threads: int | None, use_gpu: bool) -> None:
    """Before TensorFlow runs its first op: GPU memory that grows as it is used (a trial after
    another, and the user's other processes, find it free), and ``threads`` for the host's
    work (None: TensorFlow's default, every core)."""
    import tensorflow as tf

    if use_gpu:
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
    if threads is not None:
        tf.config.threading.set_intra_op_parallelism_threads(max(1, threads))
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))


def run_for_peak_rss(spec_dict: dict) -> dict:
    """A trial in this (fresh) process, then the process's peak resident memory."""
    import resource

    result = run_trial(spec_dict)
    return {"result": result,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def probe(task_path: str, steps: int, patterns: list[str], ceiling: bool,
          diagnose_steps: int) -> dict:
    from tuner.worker.task.task_loader import task_file_here  # numpy at import

    return check_task(task_file_here(task_path), steps, patterns, ceiling,
                      diagnose_steps)


def diagnose(task_path: str, steps: int) -> dict:
    from tuner.worker.diagnostics.diagnose import diagnose_task  # numpy at import
    from tuner.worker.task.task_loader import task_file_here

    return diagnose_task(task_file_here(task_path), steps)


class TrialWorker:
    """One long-lived worker process: TensorFlow imported once, reused across trials. ``node``
    names where it runs (recorded with every result)."""

    def __init__(self, threads: int, use_gpu: bool, node: str = "") -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import_frameworks()  # before anything else imports TensorFlow: see there
        configure_devices(threads, use_gpu)
        self._node = node

    def node(self) -> str:
        return self._node

    def prime_ceiling(self) -> float:
        return prime()

    def run(self, spec_dict: dict) -> dict:
        return {**run_trial(self._received(spec_dict)), "node": self._node}

    def run_live(self, spec_dict: dict) -> dict:
        return {**run_live(self._received(spec_dict)), "node": self._node}

    def keep_live_only(self, spec_dicts: list) -> int:
        return keep_only(spec_dicts)

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
        keras.backend.clear_session()
        gc.collect()
        return count

    def diagnose(self, task_path: str, shipped: dict, steps: int) -> dict:
        self._receive(task_path, shipped)
        return diagnose(task_path, steps)

    def probe(self, task_path: str, shipped: dict, steps: int,
              patterns: list[str], ceiling: bool, diagnose_steps: int) -> dict:
        self._receive(task_path, shipped)
        return probe(task_path, steps, patterns, ceiling, diagnose_steps)

    @staticmethod
    def _receive(task_path: str, shipped: dict) -> None:
        """``shipped``: the task code's digest and, in a list so that Ray passes it unresolved,
        its object reference, with its data file's name and reference where the driver
        shipped one (tuner.execution.task_shipping)."""
        import ray

        from tuner.worker.task.task_loader import receive_task  # numpy at import

        data = (shipped["data_name"], lambda: ray.get(shipped["data_ref"][0])) \
            if "data_name" in shipped else None
        receive_task(task_path, shipped["digest"], lambda: ray.get(shipped["ref"][0]), data)

    def _received(self, spec_dict: dict) -> dict:
        spec_dict = dict(spec_dict)
        self._receive(spec_dict["task_path"], spec_dict.pop("shipped"))
        return spec_dict
