"""The machine a run took its figures on, named the same way everywhere: the run's records,
the ceiling cache's key (tuner.worker.device.ceiling_cache) and the benchmarks' results files. Plain
Python, no heavy imports: both the driver and the worker use it."""

from __future__ import annotations

import platform


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
