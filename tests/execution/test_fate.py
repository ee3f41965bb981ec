"""The watchdog that ends a killed driver's processes (tuner.execution.watchdog)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

DRIVER = """
import subprocess, sys, time
from tuner.execution.watchdog import share_fate
fate = share_fate()
child = subprocess.Popen(["sleep", "300"])
assert fate.sync(), "the watchdog did not answer"   # it has seen the child: no sleep
print(child.pid, flush=True)
if sys.argv[1] == "release":
    fate.release()
    print("released", flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("how", ["killed", "release"])
def test_a_killed_driver_takes_its_children_along_a_released_one_does_not(how):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, how], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    child = int(driver.stdout.readline())
    if how == "release":
        assert driver.stdout.readline().strip() == "released"
    driver.kill()  # SIGKILL: no clean-up in the driver
    driver.wait()
    deadline = time.monotonic() + (10 if how == "killed" else 3)
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        assert _alive(child) is (how == "release")
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
