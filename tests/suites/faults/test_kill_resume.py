"""Kills a resume must repair, end to end against the real CLI: SIGKILL and Ctrl-C mid-study,
a trials.jsonl line cut short, the driver killed while its worker is busy. Nothing recorded
may be lost, and the resumed study keeps every finished trial exactly."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.suites.faults.cli_runs import (
    KILL_RUN,
    SLOW_TASK,
    _run_until,
    assert_accounted,
    command,
    fault_env,
    mlflow_trial_runs,
    records,
    run,
)

pytestmark = pytest.mark.system


def _resume_and_check(run_dir, before, fault, asked=4, executor="auto"):
    completed = run(command(run_dir, *KILL_RUN, "--trials", str(asked), "--executor", executor,
                            task=SLOW_TASK, space="quick"))
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "already finished" in completed.stdout
    after = records(run_dir)
    kept = [r for r in after if r["number"] in {b["number"] for b in before}]
    assert_accounted(fault, run_dir, finished=asked)
    assert kept == before  # finished trials kept exactly, not re-run
    assert len(after) == asked and sorted(r["number"] for r in after) == list(range(asked))
    return after


# Under the default (the local worker) and under Ray: one contract, two executors.
EXECUTORS = pytest.mark.parametrize("executor", ["auto", "ray"])
_RAY_PROGRAMS = (b"raylet", b"gcs_server")   # a Ray instance's own processes
_LOCAL_WORKER = b"tuner.worker.programs.serve"


def _expected_kind(executor: str) -> str:
    from tuner.execution.choice import choose

    return choose(executor, "auto", None, service_job=False).kind


def assert_ran_on(run_dir, marker: str, kind: str) -> None:
    """The run is on ``kind`` (``local`` or ``ray``): run.json says so, and its live processes
    (those whose environment carries ``marker``, taken while a trial runs) are the local worker
    without any Ray process, or Ray's without the local worker."""
    assert json.loads((run_dir / "run.json").read_text())["executor"]["kind"] == kind
    commands = _processes_with(marker)
    ray = [line for line in commands if any(name in line.encode() for name in _RAY_PROGRAMS)]
    local = [line for line in commands if _LOCAL_WORKER in line.encode()]
    if kind == "local":
        assert local and not ray, commands
    else:
        assert ray and not local, commands


@EXECUTORS
def test_sigkill_mid_study_then_resume(tmp_path, fault, executor):
    """Also what each case ran on: "auto" on this machine is the local worker (no Ray
    process), "ray" is Ray (no local worker)."""
    run_dir = tmp_path / "run"
    marker = f"PRECISION_TUNER_FAULT_RUN={tmp_path.name}"
    args = command(run_dir, *KILL_RUN, "--trials", "4", "--executor", executor, task=SLOW_TASK,
                   space="quick")
    process = _run_until(args, "#1", env={**fault_env("none"),
                                          "PRECISION_TUNER_FAULT_RUN": tmp_path.name})
    time.sleep(1.0)  # trial #2 is running now
    assert_ran_on(run_dir, marker, _expected_kind(executor))
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    before = records(run_dir)
    assert len(before) == 2
    _resume_and_check(run_dir, before, fault, executor=executor)
    import optuna

    storage = f"sqlite:///{run_dir / 'optuna.db'}"
    study = optuna.load_study(study_name=json.loads((run_dir / "run.json").read_text())
                              ["study_name"], storage=storage)
    states = [t.state.name for t in study.trials]
    assert "RUNNING" not in states and "FAIL" in states  # the killed trial, failed on resume
    killed = [r for r in mlflow_trial_runs(run_dir) if r.info.status == "KILLED"]
    assert len(killed) == 1 and killed[0].data.tags["verdict"] == "killed"


@EXECUTORS
def test_ctrl_c_ends_cleanly_and_leaves_the_study_resumable(tmp_path, fault, executor):
    run_dir = tmp_path / "run"
    args = command(run_dir, *KILL_RUN, "--trials", "4", "--executor", executor, task=SLOW_TASK,
                   space="quick")
    marker = f"PRECISION_TUNER_FAULT_RUN={tmp_path.name}"
    process = _run_until(args, "#1", env={**fault_env("none"),
                                          "PRECISION_TUNER_FAULT_RUN": tmp_path.name})
    time.sleep(1.0)
    assert_ran_on(run_dir, marker, _expected_kind(executor))
    os.killpg(process.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C
    output = process.stdout.read()
    assert process.wait(timeout=120) == 130, output
    assert "resume with: precision-tuner tune" in output
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    before = records(run_dir)
    _resume_and_check(run_dir, before, fault, executor=executor)


# -- a kill that cuts the last line of trials.jsonl short -------------------------------------

def test_a_truncated_last_line_of_trials_jsonl_is_repaired_on_resume(tmp_path, fault):
    run_dir = tmp_path / "run"
    args = command(run_dir, *KILL_RUN, "--trials", "4", task=SLOW_TASK, space="quick")
    process = _run_until(args, "#1")
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    log = run_dir / "trials.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    assert len(lines) == 2
    log.write_text(lines[0] + lines[1][:len(lines[1]) // 2])  # killed in the middle of a write
    completed = run(command(run_dir, *KILL_RUN, "--trials", "4", task=SLOW_TASK, space="quick"))
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "1 of 4 trials already finished" in completed.stdout
    text = log.read_text()
    assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())
    after = records(run_dir)
    assert sorted(r["number"] for r in after) == [0, 1, 2, 3]
    assert after[0] == json.loads(lines[0])  # the whole line was kept as it was
    assert_accounted(fault, run_dir, finished=4)


# -- the driver killed while its worker is busy -----------------------------------------------

def _processes_with(marker: str) -> list[str]:
    """Live processes (not zombies) whose environment carries ``marker``: what the run left."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() not in (entry / "environ").read_bytes():
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        if "\nState:\tZ" not in status:
            found.append(f"{entry.name} {(entry / 'cmdline').read_bytes()[:120]!r}")
    return found


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_the_driver_killed_while_its_worker_is_busy_leaves_no_process_behind(tmp_path, fault,
                                                                             executor):
    run_dir = tmp_path / "run"
    marker = f"PRECISION_TUNER_FAULT_RUN={tmp_path.name}"
    env = {**fault_env("none"), "PRECISION_TUNER_FAULT_RUN": tmp_path.name}
    resume = command(run_dir, "--executor", executor, "--steps", "12", "--finalists", "1",
                     "--trials", "3", task=SLOW_TASK, space="quick")
    process = _run_until(resume, "#0", env=env)
    time.sleep(1.0)  # trial #1 is training now
    assert len(_processes_with(marker)) >= 2  # the driver and its worker(s)
    process.kill()  # the driver only: its workers are not told
    process.wait()
    deadline = time.monotonic() + 60
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(1.0)
    assert _processes_with(marker) == []  # no orphan: every worker followed its driver
    completed = run(resume)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert_accounted(fault, run_dir, finished=3)
