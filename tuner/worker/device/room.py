"""The memory a worker has left for its next trial, with what it keeps held.

The float32 baseline's model stays alive in its worker so that the re-measurement starts from
it (tuner.worker.trial.live), and a process keeps part of the memory of every model it trained.
Whether the next trial still fits is the driver's decision (tuner.run.kept_models), from what
``device_room`` reads here at the end of every trial, once its model is let go:

- On a GPU: the free memory ``nvidia-smi`` reports for the worker's device, plus what
  TensorFlow's allocator holds without using it (its pool grows to the trial's peak and never
  gives memory back, but reuses it: the trial's peak less what is in use now). ``held_bytes``
  is what TensorFlow's allocator has in use (the live models, mostly).
- On a CPU: the host's available memory (Linux's ``MemAvailable``), and ``held_bytes`` as the
  growth of the worker's resident memory since it became ready (``mark_ready``).

Plain data out; None where a figure cannot be read (the driver then keeps what it kept before).
"""

from __future__ import annotations

import os
import shutil
import subprocess

_READY_RSS: list[int] = []   # the worker's resident memory when it became ready


def rss_bytes() -> int | None:
    """This process's resident memory (Linux), else None."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def mark_ready() -> None:
    """The worker has imported its frameworks and set up its devices: what it holds from now on
    counts as held by its trials."""
    _READY_RSS[:] = [rss_bytes() or 0]


def device_room() -> dict:
    """``{"source": "gpu" | "host", "free_bytes", "held_bytes", "rss_bytes"}``."""
    import tensorflow as tf

    rss = rss_bytes()
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        name = gpus[0].name.replace("/device:", "")
        info = tf.config.experimental.get_memory_info(name)
        free = _gpu_free_bytes()
        unused_pool = max(0, int(info.get("peak", 0)) - int(info.get("current", 0)))
        return {"source": "gpu", "free_bytes": None if free is None else free + unused_pool,
                "held_bytes": int(info.get("current", 0)), "rss_bytes": rss}
    ready = _READY_RSS[0] if _READY_RSS else None
    held = None if rss is None or ready is None else max(0, rss - ready)
    return {"source": "host", "free_bytes": host_available_bytes(), "held_bytes": held,
            "rss_bytes": rss}


def host_available_bytes() -> int | None:
    """Linux's estimate of the memory a new allocation can get without swapping."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _gpu_free_bytes() -> int | None:
    """The free memory of this process's first GPU, as ``nvidia-smi`` reports it: the first
    device ``CUDA_VISIBLE_DEVICES`` names (an index or a ``GPU-`` UUID, both of which
    ``nvidia-smi -i`` takes), else GPU 0. A MIG slice's is not reported there: None."""
    smi = shutil.which("nvidia-smi")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = "0" if visible is None else visible.split(",")[0].strip()
    if smi is None or not first or first.startswith(("-", "MIG-")):
        return None
    try:
        answer = subprocess.run([smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits",
                                 "-i", first], capture_output=True, text=True, timeout=10)
        return int(float(answer.stdout.split()[0]) * 2**20)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
