"""A service job's entrypoint: ``python -m tuner.cli.handoff ARGV...`` runs
``precision-tuner ARGV...`` in one of the service's spare drivers (tuner.cli.spare),
or, where none is ready, as a child process of its own (``python -m tuner``, marked by an
empty ``DIR/drivers/PID.own`` so that the keeper waits for it too), with the same result.

Around it, the job's page in the service's book (tuner.service.job_book): a job stopped while
it waited, or whose turn comes while the service stops, does not start; the task's files are
copied from the book into the job's run root; a run that began before (a job queued again
after a restart, ``submit --resume``) is resumed; how the driver ended is written down, so
that a restart queues again only what had not ended.

It claims a spare by renaming its socket (``PID.ready`` -> ``PID.claimed``: one rename wins;
where none is ready but one is still importing, it waits for that one, up to 20 s),
hands it the command line, environment, working directory and this process's standard
streams (so the job's output goes where Ray's job log reads it), passes SIGINT and SIGTERM
on (Ray's stop), and exits with the spare's status. If this process is killed, the spare
notices its end and kills itself. Imports nothing heavy: it is on every job's start-up path.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tuner.service.contract import CLAIMED, DRIVERS, OWN, READY, STARTING, live_markers
from tuner.service.job_book import RunningJob

# How long a job waits for a spare that is still importing before it imports on its own.
STARTING_WAIT_S = 20.0
_POLL_S = 0.05
_PR_SET_PDEATHSIG = 1        # prctl(2): the signal a process gets when its parent ends


def _claim(folder: Path, wait_s: float = STARTING_WAIT_S) -> socket.socket | None:
    """A ready spare's connection; None when there is none and none is starting. A spare
    still importing is waited for: it is part-way through the imports this job would
    otherwise start from the beginning (seconds of CPU), beside whatever else runs."""
    deadline = time.monotonic() + wait_s
    while True:
        connection = _claim_ready(folder)
        if connection is not None or time.monotonic() > deadline \
                or not live_markers(folder, STARTING):
            return connection
        time.sleep(_POLL_S)


def _claim_ready(folder: Path) -> socket.socket | None:
    try:
        ready = sorted(folder.glob(f"*{READY}"))
    except OSError:
        return None
    for path in ready:
        claimed = path.with_suffix(CLAIMED)
        try:
            os.rename(path, claimed)
        except OSError:                   # another job took it first
            continue
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(str(claimed))
            return connection
        except OSError:                   # it died meanwhile
            connection.close()
            claimed.unlink(missing_ok=True)
    return None


def _lines(connection: socket.socket):
    buffered = b""
    while True:
        chunk = connection.recv(4096)
        if not chunk:
            return
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield json.loads(line)


def main(argv: list[str]) -> int:
    job = RunningJob.from_environment()
    if job is not None:
        why = job.why_not_start()
        if why is not None:
            print(f"precision-tuner: the job did not start: {why}", file=sys.stderr)
            return 0
        if job.prepare() and "--resume" not in argv:
            argv = [*argv, "--resume"]      # its run began before: queued again, or resumed
    rc = _run(argv)
    if job is not None:
        job.ended(rc)
    return rc


def _run(argv: list[str]) -> int:
    service_dir = os.environ.get("PRECISION_TUNER_SERVICE_DIR")
    folder = Path(service_dir) / DRIVERS if service_dir else None
    connection = _claim(folder) if folder else None
    if connection is None:
        return _run_own(folder, argv)
    job = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(connection, [json.dumps(job).encode()], [0, 1, 2])
    replies = _lines(connection)
    spare = next(replies, {}).get("pid")
    if spare is None:
        print("precision-tuner: failed: the spare driver ended before the job began",
              file=sys.stderr)
        return 1

    def pass_on(signum, frame):
        try:
            os.kill(spare, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGINT, pass_on)
    signal.signal(signal.SIGTERM, pass_on)
    for reply in replies:
        if "rc" in reply:
            return int(reply["rc"])
    print("precision-tuner: failed: the job's driver process ended without a status (killed?)",
          file=sys.stderr)
    return 1


def _run_own(folder: Path | None, argv: list[str]) -> int:
    """``precision-tuner ARGV`` as a child process (not ``exec``: this process writes the job's
    outcome when it ends). Ray's stop signal reaches the child itself (Ray signals every
    process under the entrypoint), so this one ignores it rather than pass a second one on,
    which would interrupt the child's closing of its records."""
    if folder is not None:
        try:          # this pid lives as long as the job: the keeper sees the job run
            (folder / f"{os.getpid()}{OWN}").touch()
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-m", "tuner", *argv],
                             preexec_fn=_default_signals)
    return child.wait()


def _default_signals() -> None:
    """In the child, before it runs: the default signal handling back, and (on Linux) its
    end with this process's, as when it was this process (``exec``): a killed entrypoint
    never leaves a driver running on its own."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):     # not Linux: the child outlives a killed parent
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
