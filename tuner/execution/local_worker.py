"""The driver's side of one local worker program (tuner.worker.programs.serve): start, call,
kill.

``WorkerProcess`` starts ``python -m tuner.worker.programs.serve`` with ``subprocess`` in a
session of its own (a terminal's Ctrl-C is the driver's to handle; the driver then ends the
worker), its stdout and stderr appended to the worker log, and a socket pair between the two.
``call`` sends one request, a method of the ``TrialWorker`` the program serves by its name
(the methods a Ray actor has), and waits for its answer, for at most its time limit; a worker
that dies instead raises ``WorkerDied`` with its exit code and the log's last line, one past
its limit ``WorkerTimedOut`` (and is killed: a running TensorFlow op cannot be interrupted
otherwise). An exception the request raised in the worker is raised here as itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

import tuner
from tuner.worker.process.startup import WORKER_ENV

_PROGRAM = "tuner.worker.programs.serve"


class WorkerDied(Exception):
    def __init__(self, exit_code: int | None, log_path: str) -> None:
        self.exit_code = exit_code
        self.log_line = last_line(log_path)
        super().__init__(describe_exit(exit_code) + (f": {self.log_line}" if self.log_line else ""))


class WorkerTimedOut(Exception):
    pass


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"exit code {code}, killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def last_line(log_path: str, limit: int = 200) -> str:
    """The log's last non-empty line (a crash's reason, usually), shortened to ``limit``."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, os.path.getsize(log_path) - 8192))
            lines = [line.strip() for line in log.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    line = next((line for line in reversed(lines) if line), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


class WorkerProcess:
    """One running worker program; one request at a time."""

    def __init__(self, log_path: str, program: str = _PROGRAM) -> None:
        self.log_path = log_path
        ours, theirs = socket.socketpair()
        package_root = str(Path(tuner.__file__).resolve().parent.parent)
        env = {**os.environ, **WORKER_ENV,
               "PYTHONPATH": os.pathsep.join(filter(None, [package_root,
                                                           os.environ.get("PYTHONPATH")]))}
        with open(log_path, "ab") as log, theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", program, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
        self._connection = Connection(ours.detach())
        self._busy = False
        self._send(list(sys.path))  # what spawn gave its children: see tuner.worker.programs.serve

    def call(self, method: str, *args, timeout_s: float):
        """The served worker's ``method(*args)``: its value, or its exception raised here."""
        self._busy = True
        self._send((method, args))
        if not self._connection.poll(timeout_s):
            self.kill()
            raise WorkerTimedOut()
        try:
            status, value = self._connection.recv()
        except (EOFError, OSError):
            raise WorkerDied(self._exit_code(), self.log_path) from None
        self._busy = False
        if status == "error":
            raise value
        return value

    def _send(self, message) -> None:
        try:
            self._connection.send(message)
        except OSError:  # the worker is gone (BrokenPipeError, ConnectionResetError)
            raise WorkerDied(self._exit_code(), self.log_path) from None

    def _exit_code(self) -> int | None:
        """The dead worker's exit code; its socket is closed (nothing more will come)."""
        self._connection.close()
        try:
            return self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # its socket closed but it lives on: end it
            return self.kill()

    def kill(self) -> int | None:
        """End the worker now; its exit code."""
        if self.process.poll() is None:
            self.process.kill()
        self._connection.close()
        try:
            return self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    def close(self, timeout_s: float = 10.0) -> None:
        """End the worker: between requests it exits when its socket closes; in the middle of
        one (an interrupted call) it is killed."""
        if self._busy:
            self.kill()
            return
        self._connection.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
