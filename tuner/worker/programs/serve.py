"""The local executor's worker as a program of its own:
``python -m tuner.worker.programs.serve FD``.

It is started with ``subprocess`` (tuner.execution.local_worker), not with multiprocessing:
multiprocessing's spawn re-runs the caller's ``__main__`` in the child, so a plain script that
calls ``tuner.tune(...)`` at its top level, without ``if __name__ == "__main__":`` (as
KerasTuner and Optuna scripts are written), ran its whole self again inside the worker, which
died there before it could say why. This program imports nothing of the caller's.

It serves one ``TrialWorker`` (tuner.worker.process.trial_worker), the face a Ray actor has
too. The driver talks to it over a socket inherited as file descriptor ``FD``, in pickled
messages: first the driver's ``sys.path`` (what spawn would have given the child, so a task
file's own imports resolve as in the driver), then requests ``(method, args)``, each a call of
that worker's method, answered ``("ok", value)`` or ``("error", exception)``. Its stdout and
stderr are the worker log the driver names in its errors; a crash before or between answers
(an import error, a segfault: ``faulthandler`` writes its traceback) leaves its reason there.
It exits when the driver closes the socket, and when the driver dies (``_exit_with_parent``).
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import sys
import threading
import time
from multiprocessing.connection import Connection

from tuner.worker.process.startup import WORKER_ENV
from tuner.worker.process.trial_worker import TrialWorker


def _exit_with_parent() -> None:
    """A worker whose driver was killed (SIGKILL leaves no time to clean up) exits too."""
    parent = os.getppid()
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def _start() -> TrialWorker:
    """The worker, before its first request: its stdout and stderr (TensorFlow and Keras
    chatter, user prints) are the worker log already; the frameworks are imported once, and
    TensorFlow has every core."""
    os.environ.update(WORKER_ENV)
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    import warnings

    warnings.simplefilter("ignore")
    return TrialWorker(threads=None, use_gpu=True)


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` if it survives the trip to the driver, else a RuntimeError with its line."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any exception type a task may raise
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def serve(connection: Connection) -> int:
    sys.path[:] = connection.recv()
    worker = _start()
    while True:
        try:
            method, args = connection.recv()
        except EOFError:  # the driver closed the socket: done
            return 0
        try:
            answer = ("ok", getattr(worker, method)(*args))
        except BaseException as exc:  # noqa: BLE001 - the driver decides what it means
            answer = ("error", _sendable(exc))
        connection.send(answer)


def main(argv: list[str]) -> int:
    faulthandler.enable()  # a segfault's traceback to the log
    return serve(Connection(int(argv[0])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
