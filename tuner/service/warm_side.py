"""The service's warm side, started by ``service start`` (tuner.service.server) and described
by ``service status``: its warm workers' pool (``python -m tuner.execution.warm_pool`` against
the service's cluster) and its spare drivers' keeper (tuner.cli.spare)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tuner.errors import TunerError
from tuner.service.contract import CLAIMED, DRIVERS, READY, SPARES, STARTING
from tuner.service.service_info import ServiceInfo, alive

START_TIMEOUT_S = 120.0


def start_spares(service_dir: Path, env: dict[str, str]) -> int:
    """The keeper of the spare drivers (tuner.cli.spare): ``tune`` processes with their
    libraries imported, which the jobs' entrypoints (tuner.cli.handoff) run in."""
    log = open(service_dir / "logs" / "drivers.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "tuner.cli.spare", "keep", "--dir",
                                str(service_dir / DRIVERS)],
                               env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    return process.pid


_SPARE_STATES = {READY: "ready", CLAIMED: "running a job", STARTING: "starting"}


def spares(info: ServiceInfo) -> dict[str, int]:
    """The spare drivers now: ``{"ready": N, "running a job": M, "starting": K}``."""
    counts = dict.fromkeys(_SPARE_STATES.values(), 0)
    folder = Path(info.dir) / DRIVERS
    for path in folder.glob("*") if folder.is_dir() else []:
        if path.suffix in _SPARE_STATES:
            counts[_SPARE_STATES[path.suffix]] += 1
    return counts


def wait_for_spares(info: ServiceInfo, wait_s: float = 60.0) -> None:
    """Until every spare driver is ready, so that the first jobs find them (a job that finds
    none runs as its own process, as without them)."""
    deadline = time.monotonic() + wait_s
    while spares(info)["ready"] < SPARES and time.monotonic() < deadline:
        if not alive(info.drivers_pid):
            raise TunerError(f"the spare drivers' keeper exited during start-up; see "
                             f"{Path(info.dir) / 'logs' / 'drivers.log'}")
        time.sleep(0.2)


def spares_line(info: ServiceInfo) -> str:
    if not info.drivers_pid:
        return "  spare drivers: none (started with --warm-workers 0: each job starts its own)"
    counts = spares(info)
    return ("  spare drivers: " + ", ".join(f"{n} {kind}" for kind, n in counts.items())
            + " (`tune` processes with their libraries imported; a job runs in one)")


def pool_command(info: ServiceInfo, env: dict[str, str], action: str, *extra: str,
                  timeout_s: float = 60.0) -> dict | None:
    """``python -m tuner.execution.warm_pool ACTION`` on the service's cluster, with the
    head's environment (its token): the pool's keeper as it answers (None: no pool)."""
    done = subprocess.run([sys.executable, "-m", "tuner.execution.warm_pool", action,
                           "--address", info.ray_address, *extra],
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        with open(Path(info.dir) / "logs" / "pool.log", "a") as log:
            log.write(done.stdout + done.stderr)
        raise TunerError(f"the warm workers did not start ({_last_line(done.stderr)}); see "
                         f"{Path(info.dir) / 'logs' / 'pool.log'}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def start_pool(info: ServiceInfo, env: dict[str, str]) -> dict | None:
    """The warm workers (tuner.execution.warm_pool), TensorFlow imported in each."""
    return pool_command(info, env, "start", "--slots", str(info.warm_workers or 0),
                         "--wait", "120", timeout_s=START_TIMEOUT_S + 60)


def pool_line(state: dict) -> str:
    rows = state.get("rows", [])
    slots = sum(row["slots"] for row in rows)
    primed = state.get("primed") or {}
    return (f"  warm workers: {slots} slot worker(s) and {len(rows)} timing worker(s) on "
            f"{len(rows)} node(s)" + (f", {len(state['starting'])} still starting"
                                      if state.get("starting") else ", TensorFlow imported")
            + (f"; the device's ceiling timed in {len(primed)} of them "
               f"({sum(primed.values()):.1f} s), so no job waits on it" if primed else ""))
