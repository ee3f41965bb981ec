"""The machine a run took its figures on, named the same way everywhere: the run's records,
the ceiling cache's key (tuner.worker.device.ceiling_cache) and the benchmarks' results files;
and where this machine keeps precision-tuner's caches (``cache_dir``). Plain Python, no heavy
imports: both the driver and the worker use it."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cache_dir() -> Path:
    """``$PRECISION_TUNER_CACHE_DIR``, else ``precision-tuner`` under ``$XDG_CACHE_HOME``
    (``~/.cache``). Nothing in it is needed: a cache that cannot be read is made again."""
    explicit = os.environ.get("PRECISION_TUNER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "precision-tuner"


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), or what the platform says elsewhere."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_description() -> str:
    return f"{cpu_model()} ({platform.system()} {platform.machine()})"
