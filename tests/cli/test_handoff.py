"""A service job's entrypoint (tuner.cli.handoff) and the spare drivers it runs in
(tuner.cli.spare), without a cluster: a job handed to a spare prints, fails and exits exactly
as `precision-tuner` run on its own would; the keeper replaces the spare it took once no job
runs on the node (in a spare or as its own process), never beside one; with no spare ready the
entrypoint waits for one still importing, or runs the command itself; a killed entrypoint takes
its spare with it."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

SPARE_LINE = "this job runs in one of the service's spare drivers"


def _wait(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _start_keeper(tmp_path, spares: int):
    drivers = tmp_path / "drivers"
    process = subprocess.Popen([sys.executable, "-m", "tuner.cli.spare", "keep", "--dir",
                                str(drivers), "--spares", str(spares)], cwd=ROOT,
                               start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    _wait(lambda: drivers.is_dir() and len(list(drivers.glob("*.ready"))) == spares)
    return process


@pytest.fixture
def keeper(tmp_path):
    process = _start_keeper(tmp_path, 1)
    try:
        yield tmp_path
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _children(pid: int) -> list[int]:
    return [int(child) for child in
            open(f"/proc/{pid}/task/{pid}/children").read().split()]


def _slow_job(service_dir):
    """A tuning job of slow steps, through the entrypoint: it runs until the entrypoint goes."""
    env = {**os.environ, "PRECISION_TUNER_SERVICE_DIR": str(service_dir)}
    return subprocess.Popen([sys.executable, "-m", "tuner.cli.handoff", "tune",
                             str(ROOT / "tests" / "fixtures" / "tasks" / "slow_steps.py"),
                             "--run-dir", str(service_dir / "run"), "--trials", "3"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _handoff(service_dir, *argv, **popen):
    env = {**os.environ, "PRECISION_TUNER_SERVICE_DIR": str(service_dir)}
    return subprocess.run([sys.executable, "-m", "tuner.cli.handoff", *argv], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120, **popen)


def test_a_job_handed_to_a_spare_answers_as_the_command_itself(keeper, tmp_path):
    spare = int(next((keeper / "drivers").glob("*.ready")).stem)
    shown = _handoff(keeper, "--version")
    assert shown.returncode == 0 and shown.stdout.splitlines() == [
        f"precision-tuner: {SPARE_LINE} (its libraries already imported)",
        subprocess.run([sys.executable, "-m", "tuner", "--version"], capture_output=True,
                       text=True).stdout.strip()]
    _wait(lambda: not os.path.exists(f"/proc/{spare}"))                 # one job per spare
    _wait(lambda: list((keeper / "drivers").glob("*.ready")))           # and a new one
    refused = _handoff(keeper, "tune", str(tmp_path / "missing.py"))
    alone = subprocess.run([sys.executable, "-m", "tuner", "tune", str(tmp_path / "missing.py")],
                           capture_output=True, text=True)
    assert SPARE_LINE in refused.stdout
    assert (refused.returncode, refused.stderr) == (alone.returncode, alone.stderr) == (
        2, alone.stderr)
    assert len(refused.stderr.strip().splitlines()) == 1


def test_with_no_spare_ready_the_entrypoint_runs_the_command_itself(tmp_path):
    shown = _handoff(tmp_path, "--version")                 # tmp_path/drivers does not exist
    assert shown.returncode == 0 and SPARE_LINE not in shown.stdout
    assert shown.stdout.startswith("precision-tuner ")


def test_a_killed_entrypoint_takes_its_spare_with_it(keeper):
    spare = int(next((keeper / "drivers").glob("*.ready")).stem)
    entry = _slow_job(keeper)
    try:
        _wait(lambda: (keeper / "drivers" / f"{spare}.claimed").exists())
        time.sleep(1.0)
        assert os.path.exists(f"/proc/{spare}")
        entry.kill()
        entry.wait()
        _wait(lambda: not os.path.exists(f"/proc/{spare}")
              or open(f"/proc/{spare}/stat").read().split(")")[-1].split()[0] == "Z")
    finally:
        entry.kill()


def test_while_a_job_runs_in_a_spare_the_keeper_replaces_it_only_after(tmp_path):
    """A spare's imports take seconds of CPU: with another spare ready, the one a job took is
    replaced once the job ends, not beside it."""
    process = _start_keeper(tmp_path, 2)
    drivers = tmp_path / "drivers"
    try:
        entry = _slow_job(tmp_path)
        try:
            _wait(lambda: list(drivers.glob("*.claimed")))
            time.sleep(3.0)          # the keeper polls every 0.2 s: a refill would be running
            assert len(_children(process.pid)) == 2            # the job's and the ready one
            assert len(list(drivers.glob("*.ready"))) == 1
        finally:
            entry.kill()
            entry.wait()
        _wait(lambda: len(list(drivers.glob("*.ready"))) == 2)  # replaced once it ended
        assert not list(drivers.glob("*.claimed"))
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_no_spare_is_started_beside_a_job_even_when_none_is_left(tmp_path):
    """Both spares gone (here the only one) and a second job running as its own process: the
    keeper waits for both jobs before it imports a new spare."""
    process = _start_keeper(tmp_path, 1)
    drivers = tmp_path / "drivers"
    try:
        first = _slow_job(tmp_path)
        second = None
        try:
            _wait(lambda: list(drivers.glob("*.claimed")))
            second = _slow_job(tmp_path)                     # no spare ready: its own process
            _wait(lambda: (drivers / f"{second.pid}.own").exists())
            time.sleep(2.0)
            assert len(_children(process.pid)) == 1          # the first job's spare only
            first.kill()
            first.wait()
            _wait(lambda: not list(drivers.glob("*.claimed")))
            time.sleep(2.0)                                  # the second still runs
            assert _children(process.pid) == [] and not list(drivers.glob("*.ready"))
        finally:
            for entry in (first, second):
                if entry is not None:
                    entry.kill()
                    entry.wait()
        _wait(lambda: len(list(drivers.glob("*.ready"))) == 1)  # once both ended
        assert not list(drivers.glob("*.own"))
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_job_waits_for_a_spare_still_importing_rather_than_import_itself(tmp_path):
    drivers = tmp_path / "drivers"
    process = subprocess.Popen([sys.executable, "-m", "tuner.cli.spare", "keep", "--dir",
                                str(drivers), "--spares", "1"], cwd=ROOT,
                               start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: drivers.is_dir() and list(drivers.glob("*.starting")))
        assert not list(drivers.glob("*.ready"))      # its imports take seconds from here
        shown = _handoff(tmp_path, "--version")
        assert shown.returncode == 0 and SPARE_LINE in shown.stdout
        assert not list(drivers.glob("*.own"))
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_spare_s_imported_objects_are_out_of_the_collector_s_reach():
    """A full collection in a spare scans only what its job allocates, not the ~290,000
    objects of the libraries it imported (a 0.2 s pause, seen on the first-trial path)."""
    check = ("import gc; from tuner.cli import spare; spare._import_libraries(); "
             "print(gc.get_freeze_count(), len(gc.get_objects()))")
    frozen, tracked = map(int, subprocess.run([sys.executable, "-c", check], cwd=ROOT,
                                              capture_output=True, text=True, check=True,
                                              timeout=120).stdout.split())
    assert frozen > 100_000 and tracked < frozen / 100
