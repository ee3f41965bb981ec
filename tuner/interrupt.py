"""Ctrl-C and `precision-tuner stop` (Ray sends the job SIGINT), kept until the job acts on them.

A SIGINT raises KeyboardInterrupt in whatever the driver's main thread runs at that moment. A
stop sent right after a service job's first trial was once not acted on at all: the job ran to
its end 42 s later, as if the interrupt had been caught and dropped inside a library call. The
handler here also remembers the request, and the search and the re-measurement check it
between runs (``raise_if_requested``), so a swallowed interrupt is raised again there.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_requested = threading.Event()


def _on_sigint(signum, frame) -> None:
    _requested.set()
    raise KeyboardInterrupt


def install() -> None:
    """Handle SIGINT in this (the driver's) process; call from the main thread."""
    _requested.clear()
    signal.signal(signal.SIGINT, _on_sigint)


@contextlib.contextmanager
def handling():
    """SIGINT handled as above for the job's length, then the caller's handler again (a
    notebook kernel's own, say). Off the main thread, where no signal arrives, nothing to do."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    install()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _requested.clear()


def raise_if_requested() -> None:
    if _requested.is_set():
        raise KeyboardInterrupt
