"""The device's ceiling figures kept on disk, so that a machine pays for them once.

The device's own figures (``tuner.worker.device.ceiling``: the 256-wide step and the peak)
describe the hardware and TensorFlow's kernels for it, not the model: every tune on the same
machine, the same device, the same TensorFlow and the same thread count measures the same thing.
They cost 0.8 s of every tune's start-up on this project's 2-core CPU, a few percent of a quick
tune's wall time. Kept here, keyed by all four, for ``MAX_AGE_S``; a run that reuses them says
so, with when they were taken and where they are kept (delete the file to measure again).

The model's figure (its largest layer's product at the task's batch size) depends on the
same four and its shape: it is kept beside them, under ``"models"`` by shape (``add_model``),
and goes when they go.

The file is ``$PRECISION_TUNER_CACHE_DIR/ceiling.json``, by default under ``$XDG_CACHE_HOME``
(``~/.cache/precision-tuner``). A file that cannot be read or written is ignored: the ceiling
is then measured, as before.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tuner.machine import cache_dir, cpu_model

MAX_AGE_S = 7 * 24 * 3600.0


def cache_path() -> Path:
    return cache_dir() / "ceiling.json"


def machine_key(device: str) -> str:
    """What the figures depend on: the device (a GPU by its model), the CPU, TensorFlow and
    the threads its kernels may use."""
    import tensorflow as tf

    name = device
    if "GPU" in device:
        gpus = tf.config.list_physical_devices("GPU")
        details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}
        name = f"{device} {details.get('device_name', '')}".strip()
    return " | ".join([name, cpu_model(), f"tensorflow {tf.__version__}",
                       f"threads {tf.config.threading.get_intra_op_parallelism_threads()}"
                       f"/{os.cpu_count()}"])


def read(key: str) -> dict | None:
    """The figures kept for ``key``, younger than ``MAX_AGE_S``; None otherwise."""
    try:
        kept = json.loads(cache_path().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(kept, dict) or time.time() - kept.get("taken", 0.0) > MAX_AGE_S:
        return None
    return kept.get("figures")


def write(key: str, figures: dict) -> None:
    kept = _file()
    kept[key] = {"taken": time.time(), "figures": figures}
    _replace(kept)


def add_model(key: str, shape: str, figure: dict) -> None:
    """Keep a model's figure (``shape``: "batchxinxout") beside ``key``'s device figures;
    nothing where none are kept (the model's figure is then timed again next time)."""
    kept = _file()
    entry = kept.get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("figures"), dict):
        return
    entry["figures"].setdefault("models", {})[shape] = figure
    _replace(kept)


def _file() -> dict:
    try:
        kept = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def _replace(kept: dict) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(kept, indent=1))
        os.replace(temporary, path)
    except OSError:
        pass
