"""What a worker process does once, before its first trial: import the frameworks, then freeze,
then set up the devices (``configure_devices``: GPU memory that grows, TensorFlow's threads).
``WORKER_ENV`` is the environment the driver starts a worker program with.

Two costs of every tune's start-up, measured on the 2-core CPU machine:

- Importing TensorFlow (which imports Keras) took 2.5 s, 0.8 s of it in scikit-learn and
  matplotlib: Keras imports them when they are installed, for its scikit-learn estimator
  wrappers (``keras.wrappers``) and image-gallery plots (``keras.visualization``), neither of
  which a trial trains or uses. They are hidden while Keras is imported (1.7 s then) and
  importable again right after, so a task file that imports either one gets the real module.
- Every trial starts with ``gc.collect()`` (``reset_keras_state``: the previous trial's model must
  be gone before this one is built and its memory measured). After the import the collector
  tracked about 400,000 objects and a full collection walked all of them: 0.10-0.13 s per call,
  several calls per trial, and as much again whenever Python's own collection ran in the
  middle of a timed step. ``gc.freeze()`` moves the objects alive at that point (modules,
  classes, the frameworks' registries: none of them ever becomes garbage) into the permanent
  generation, which collections skip; a collection after a trial then takes 1-3 ms. Objects
  created later, the trials' models included, are collected as before.
"""

from __future__ import annotations

import gc
import importlib
import sys

# TensorFlow's C++ logging would otherwise flood the terminal from the worker.
WORKER_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}
# Optional packages Keras imports at its own import time for features no trial uses.
_NOT_FOR_TRIALS = ("sklearn", "matplotlib")


def import_frameworks() -> None:
    """Import TensorFlow and Keras once, and keep the collector off what they left alive."""
    hidden = [name for name in _NOT_FOR_TRIALS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import name` raises ImportError
    try:
        importlib.import_module("tensorflow")  # which imports Keras
        importlib.import_module("keras")
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    gc.collect()
    gc.freeze()


def prepare_process(threads: int | None = None, use_gpu: bool = True) -> dict:
    """What every process the tool starts to run TensorFlow does first, through this one
    function (a trial's worker, a Ray actor, ``train``'s trainings, ``bench``'s measurements):
    import the frameworks, then configure the devices before TensorFlow allocates anything.
    Without it TensorFlow maps nearly all of a GPU's memory to each process, and the second of
    two on one GPU starves. Returns ``configure_devices``' record."""
    import_frameworks()
    return configure_devices(threads, use_gpu)


def configure_devices(threads: int | None, use_gpu: bool) -> dict:
    """Before TensorFlow runs its first op: GPU memory that grows as it is used (a trial after
    another, and the user's other processes, find it free), and ``threads`` for the host's
    work (None: TensorFlow's default, every core). Returns what was done, as plain data:
    ``gpus`` (the GPUs TensorFlow sees), ``memory_growth``, ``threads``, ``visible`` (this
    process's ``CUDA_VISIBLE_DEVICES``) and ``before_tensorflow`` (False where TensorFlow had
    already set up its devices: then nothing could be changed)."""
    import os

    import tensorflow as tf

    started = _tensorflow_started(tf)
    gpus = tf.config.list_physical_devices("GPU")
    growth = False
    if use_gpu and gpus and not started:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        growth = True
    if threads is not None and not started:
        tf.config.threading.set_intra_op_parallelism_threads(max(1, threads))
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    return {"gpus": [gpu.name for gpu in gpus], "memory_growth": growth, "threads": threads,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "before_tensorflow": not started}


def _tensorflow_started(tf) -> bool:
    """Whether TensorFlow has set up its devices in this process (its eager context is
    initialised by the first op or device query that needs them): its own private flag, read
    defensively (a TensorFlow without it counts as not started, as the call then finds)."""
    from tensorflow.python.eager import context  # TensorFlow's private module, read only here

    return bool(getattr(context.context(), "_initialized", False))
