"""Trials on real Ray: a local pool of two workers, one of them killed mid-trial. (A two-node
cluster on loopback, a lost node and hung workers: tests/faults.)"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TASKS
from tests.support.records import read_trials

pytestmark = pytest.mark.system
BIN = Path(sys.executable).parent


def tune(*args, env=None, **popen):
    # float16 too, as on a device with fast float16: these tests count trials per config.
    command = [sys.executable, "-m", "tuner", "tune", *args, "--keep-slow-policies"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                            **popen)


def trials_of(run_dir):
    return read_trials(run_dir)


def test_local_pool_of_two_workers_runs_a_study(tmp_path):
    process = tune(str(TASKS / "tiny_mlp.py"), "--trials", "5", "--steps", "12", "--workers", "2",
                   "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "best.json"))
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-3000:]
    trials = trials_of(tmp_path / "run")
    assert len(trials) == 5
    assert trials[0]["result"]["exclusive_timing"] is True       # the baseline runs alone
    assert any(not t["result"]["exclusive_timing"] for t in trials[1:])  # then side by side
    assert "‡ timed while another trial ran" in output
    remeasured = [t for t in trials if t["remeasured_ms"] is not None]
    if "every stable 16-bit config is clearly slower than float32" in output:
        # On a CPU, 12 steps can put every 16-bit trial clearly behind float32: then nothing
        # is re-timed, and the summary names each one it dropped.
        assert remeasured == []
        stable = {t["number"] for t in trials[1:] if t["verdict"] == "stable"}
        dropped = {int(n) for n in re.findall(r"dropped #(\d+) ", output)}
        assert dropped and dropped <= stable
    else:
        assert trials[0] in remeasured and len(remeasured) >= 2
        assert all(t["verdict"] == "stable" for t in remeasured)


def _actor_pids(method, marker):
    """This test's actors running ``method``: Ray's workers inherit the environment of the
    driver that started the local Ray, so its ``marker`` tells them from other tests' actors
    (the suite runs its modules side by side)."""
    found = subprocess.run(["pgrep", "-f", f"ray::TrialActor.{method}"], capture_output=True,
                           text=True)
    mine = []
    for pid in found.stdout.split():
        try:
            if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                mine.append(int(pid))
        except OSError:
            continue
    return mine


def test_worker_killed_mid_trial_fails_only_that_trial(tmp_path):
    marker = f"PRECISION_TUNER_TEST_RUN={tmp_path}"
    process = tune(str(TASKS / "slow_steps.py"), "--trials", "5", "--steps", "15",
                   "--finalists", "1", "--workers", "2", "--run-dir", str(tmp_path / "run"),
                   "--out", str(tmp_path / "best.json"),
                   env={"PRECISION_TUNER_TEST_RUN": str(tmp_path)})
    lines = []
    killed = None
    deadline = time.monotonic() + 300
    for line in process.stdout:  # wait for the baseline, then kill a worker mid-trial
        lines.append(line)
        if line.strip().startswith("#0"):
            while killed is None and time.monotonic() < deadline:
                pids = _actor_pids("run", marker)
                if pids:
                    killed = pids[0]
                    os.kill(killed, signal.SIGKILL)
                else:
                    time.sleep(0.05)
    process.wait(timeout=600)
    output = "".join(lines)
    assert killed is not None, output[-3000:]
    assert process.returncode == 0, output[-3000:]
    trials = trials_of(tmp_path / "run")
    crashed = [t for t in trials if t["result"]["failure_class"] == "worker_crashed"]
    # The model has no softmax: fitted to it, the quick space holds 4 distinct configs, each
    # run once (the crashed one is not retried), however many trials were asked for.
    assert "float32 group 'softmax' matches no layer" in output
    assert len(trials) == 4 and len(crashed) == 1, [t["reason"] for t in trials]
    assert "worker process crashed" in crashed[0]["reason"]
    assert all(t["verdict"] != "failed" for t in trials if t not in crashed)


def test_a_local_ray_that_cannot_start_is_one_line_that_names_the_way_round(tmp_path):
    """Ray refuses to start under a temporary directory whose socket paths pass 107 bytes (a
    container's long TMPDIR): one line with Ray's reason and --executor local, exit 1, no
    traceback and no run directory."""
    long_tmp = tmp_path / ("t" * 110)
    long_tmp.mkdir()
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", str(TASKS / "tiny_mlp.py"), "--executor", "ray",
         "--run-dir", str(run_dir), "--out", str(tmp_path / "best.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TMPDIR": str(long_tmp)})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    failed = [line for line in done.stderr.splitlines() if line.startswith("precision-tuner:")]
    assert len(failed) == 1 and "cannot start a local Ray instance" in failed[0]
    assert "AF_UNIX path length" in failed[0] and "--executor local" in failed[0]
    assert not run_dir.exists()


def test_a_ray_actor_without_room_for_the_next_trial_is_replaced_by_a_fresh_one(tmp_path):
    """One actor on the Ray this job starts keeps float32's model alive for the re-measurement
    (tuner.run.kept_models); with no room left for a trial within --worker-memory, a fresh
    actor takes its place before the next trial, and the trials go on there."""
    import json

    process = tune(str(TASKS / "tiny_mlp.py"), "--trials", "3", "--steps", "12",
                   "--executor", "ray", "--workers", "1", "--worker-memory", "0.02",
                   "--no-confirm", "--run-dir", str(tmp_path / "run"),
                   "--out", str(tmp_path / "best.json"))
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-3000:]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    first = run["live_models"][0]
    assert first["after_trial"] == 0 and first["released"] == [0] and first["fresh_worker"]
    assert first["rss_after"] < first["rss_before"], first
    trials = trials_of(tmp_path / "run")
    assert len(trials) == 3 and all(t["result"]["outcome"] == "completed" for t in trials)
