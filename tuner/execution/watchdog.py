"""A watchdog that ends the processes a driver started once the driver dies without cleaning up.

Why: a driver killed with SIGKILL (or by the OOM killer) cannot call ``ray.shutdown()``, and
the local Ray instance it started does not follow it at once: in the fault suite, Ray's
dashboard agent and two other processes were still alive a minute after their driver was
SIGKILLed. ``share_fate()`` starts this module as a small process (no Ray, no TensorFlow) that
keeps a list of the driver's descendants, refreshed every second, and holds a pipe from the
driver: when the pipe reaches EOF without the word ``done`` (the driver is gone), it kills
every process on that list and their descendants. ``Fate.release()`` (after a clean shutdown)
sends ``done`` and the watchdog exits leaving everything alone. ``Fate.sync()`` asks for a scan
at once and waits for it: a process started just before is then on the list, which otherwise
holds only what the last refresh (up to a second old) saw. Linux only (``/proc``); elsewhere
nothing is started.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

_REFRESH_S = 1.0


class Fate:
    """The driver's end of a watchdog (``share_fate``)."""

    def __init__(self, process: subprocess.Popen | None) -> None:
        self._process = process

    def sync(self, timeout: float = 10.0) -> bool:
        """Have the watchdog scan the driver's descendants now; True once it has (False where
        no watchdog runs or it did not answer within ``timeout`` seconds)."""
        process = self._process
        if process is None:
            return False
        try:
            process.stdin.write(b"sync\n")
            process.stdin.flush()
        except OSError:
            return False
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        return bool(ready) and process.stdout.readline().strip() == b"synced"

    def release(self) -> None:
        """The driver cleaned up itself: the watchdog leaves its processes alone and exits."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.stdin.write(b"done\n")
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def share_fate() -> Fate:
    """Start a watchdog for this process's descendants (see the module docstring)."""
    if not Path("/proc/self/stat").exists():
        return Fate(None)
    process = subprocess.Popen([sys.executable, "-m", "tuner.execution.watchdog", str(os.getpid())],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    return Fate(process)


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _descendants(roots: set[int]) -> set[int]:
    children = _children()
    found, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def watch(driver: int) -> None:
    me = os.getpid()
    known: set[int] = set()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        ready, _, _ = select.select([stdin], [], [], _REFRESH_S)
        if ready:
            word = stdin.readline().strip()
            if word == b"done":
                return  # a clean shutdown: nothing to do
            if word != b"sync":
                break  # EOF: the driver is gone
        known = _descendants({driver}) - {me}
        if ready:
            try:
                stdout.write(b"synced\n")
                stdout.flush()
            except OSError:
                pass
    for pid in (known | _descendants(known)) - {me}:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    watch(int(sys.argv[1]))
