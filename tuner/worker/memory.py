"""A trial's peak memory: the GPU allocator's peak, else host RSS growth (sampled)."""

from __future__ import annotations

import os
import threading


class MemoryMeter:
    """Peak memory of the trial: the GPU allocator's peak, else host RSS growth (sampled)."""

    def __init__(self) -> None:
        self._gpu = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._baseline = 0
        self._peak = 0

    def start(self) -> None:
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            self._gpu = gpus[0].name.replace("/device:", "")
            tf.config.experimental.reset_memory_stats(self._gpu)
            return
        self._baseline = self._peak = _rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self._peak = max(self._peak, _rss_bytes())

    def stop(self) -> tuple[int | None, str]:
        if self._gpu is not None:
            import tensorflow as tf

            return int(tf.config.experimental.get_memory_info(self._gpu)["peak"]), "gpu_peak"
        if self._thread is None:
            return None, ""
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, _rss_bytes())
        return self._peak - self._baseline, "host_rss_growth"


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: fall back to the lifetime peak
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
