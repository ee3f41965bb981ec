"""Spare drivers: ``precision-tuner`` processes the service keeps ready for its next jobs.

A job's ``tune`` process spends about 1.5 s importing its libraries (Ray, MLflow, Optuna's
SQLite storage, the tuner itself, matplotlib) and most of a second tearing the interpreter
down after its results are written: a small warm job's whole overhead. So ``service start``
(with warm workers) also starts a keeper that holds ``SPARES`` processes with those libraries
imported and their first uses made (an Optuna study, MLflow's request headers), each waiting
on a Unix socket in ``DIR/drivers/``. A job's entrypoint (tuner.cli.handoff) claims one, hands
it its command line, environment, working directory and standard streams, and waits for its
exit status, passing Ray's stop signal on. The keeper starts a new spare for each one taken
once no job runs on the node at all, in a spare or as its own process: a spare's imports are
seconds of CPU, which would slow the jobs beside them and land in their timed phases (on a
2-core node, a refill beside another job's re-measurement widened its intervals until the
round cap). A job that finds no spare ready waits for one still importing, if any, or runs
as its own process, paying its own imports. One job per spare: each job still runs in a
process of its own, with nothing left over from another job.

    DIR/drivers/PID.starting   a spare importing (its socket, not yet taken: a job that finds
                               no spare ready waits for it, up to 20 s, rather than import)
    DIR/drivers/PID.ready      a spare waiting for a job: its socket
    DIR/drivers/PID.claimed    the same socket, renamed by the job that took it
    DIR/drivers/PID.own        a job running as its own process PID (no spare was ready)

    python -m tuner.cli.spare keep --dir DIR/drivers [--spares 2]     # the keeper
    python -m tuner.cli.spare serve --dir DIR/drivers                 # one spare
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from tuner.api.job import RECORD_MODULES
from tuner.cli.app import main as cli_main
from tuner.service.contract import CLAIMED, OWN, READY, SPARES, STARTING, live_markers

_POLL_S = 0.2
_BACKOFF_S = 10.0


# -- one spare -----------------------------------------------------------------------------
def _import_libraries() -> None:
    import tempfile

    import matplotlib

    matplotlib.use("Agg")  # as tuner.records.plots renders: to files only
    for module in (*RECORD_MODULES, "matplotlib.pyplot", "tuner.api.tuning", "ray"):
        importlib.import_module(module)
    # A process's first Optuna study (its schema made by SQLAlchemy) took 0.36 s against
    # 0.11 s for the next, and its first reopened store (the job's, staged by StagedStores)
    # 0.2 s, loading Alembic's version scripts: the job's are its next.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="precision-tuner-spare-") as folder:
        storage = f"sqlite:///{folder}/optuna.db"
        optuna.load_study(study_name=optuna.create_study(storage=storage).study_name,
                          storage=storage)
    # MLflow's first request resolves its request headers, whose Databricks check imports
    # IPython where it is installed (0.25 s of the job's first request to the tracking server).
    from mlflow.tracking.request_header.registry import resolve_request_headers

    resolve_request_headers()
    freeze_imported()


def freeze_imported() -> None:
    """Collect once, then move every object alive now (the libraries' modules, classes and
    caches: 290,000 tracked objects here) out of the garbage collector's reach (``gc.freeze``).
    Without it a full collection scanned them all whenever the job's allocations triggered
    one (0.20 s in a quiet process; 0.23-0.24 s with the job stopped, seen in most traced warm
    jobs between the task check and the first trial). The workers do the same after their imports
    (tuner.worker.process.startup); these objects live as long as the process anyway."""
    import gc

    gc.collect()
    gc.freeze()


def serve(folder: Path) -> int:
    """Import, wait for one job, run it as ``precision-tuner ARGV`` would, report its status."""
    pid = os.getpid()
    starting = folder / f"{pid}{STARTING}"    # there from the start: a job finding no spare
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)   # ready waits for this one
    listener.bind(str(starting))
    listener.listen(1)
    _import_libraries()
    os.rename(starting, folder / f"{pid}{READY}")
    connection, _ = listener.accept()
    listener.close()
    message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    job = json.loads(message.decode())
    for fd, standard in zip(fds, (0, 1, 2)):
        os.dup2(fd, standard)
        os.close(fd)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    # The job's entrypoint gone (killed, SIGKILL after Ray's stop) means the job is: die with
    # it, as the `tune` process it stands for would have.
    threading.Thread(target=_end_with, args=(connection,), daemon=True).start()
    print("precision-tuner: this job runs in one of the service's spare drivers (its "
          "libraries already imported)", flush=True)
    code = _run(job["argv"])
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        connection.sendall(json.dumps({"rc": code}).encode() + b"\n")
    except OSError:
        pass
    return code


def _run(argv: list[str]) -> int:
    try:
        return cli_main(argv)
    except SystemExit as exc:    # argparse's --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - what an uncaught error would print, then status 1
        traceback.print_exc()
        return 1


def _end_with(connection: socket.socket) -> None:
    while True:
        try:
            if not connection.recv(64):
                break
        except OSError:
            break
    os.kill(os.getpid(), signal.SIGKILL)


# -- the keeper ----------------------------------------------------------------------------
def keep(folder: Path, spares: int, log) -> None:
    """Keep ``spares`` unclaimed spares, replacing each one a job takes; until killed."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.iterdir():           # an earlier keeper's, killed with its spares
        stale.unlink(missing_ok=True)
    children: dict[int, subprocess.Popen] = {}
    command = [sys.executable, "-m", "tuner.cli.spare", "serve", "--dir", str(folder)]
    failed_at = -_BACKOFF_S
    while True:
        for pid, child in list(children.items()):
            if child.poll() is not None:
                del children[pid]
                if not (folder / f"{pid}{CLAIMED}").exists():   # died before any job
                    failed_at = time.monotonic()
                for suffix in (STARTING, READY, CLAIMED):
                    (folder / f"{pid}{suffix}").unlink(missing_ok=True)
        waiting = [pid for pid in children if not (folder / f"{pid}{CLAIMED}").exists()]
        # Jobs running as their own processes count too (markers of ended ones go).
        running = len(children) - len(waiting) + live_markers(folder, OWN, remove_dead=True)
        # Replaced only on a quiet node (see the module's text). A spare that cannot start (a
        # broken install) is not retried in a tight loop: its error is in the log, and jobs
        # run as their own processes meanwhile.
        if not running and time.monotonic() - failed_at >= _BACKOFF_S:
            for _ in range(spares - len(waiting)):
                child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log)
                children[child.pid] = child
        time.sleep(_POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner.cli.spare",
                                     description="the service's spare drivers")
    parser.add_argument("action", choices=("keep", "serve"))
    parser.add_argument("--dir", required=True, type=Path, help="the drivers' folder")
    parser.add_argument("--spares", type=int, default=SPARES)
    args = parser.parse_args(argv)
    if args.action == "serve":
        return serve(args.dir)
    keep(args.dir, args.spares, sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
