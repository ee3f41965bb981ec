"""Faults injected end to end against the real CLI: nothing recorded may be lost."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.records import read_trials

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
TASK = str(HERE / "faulty_task.py")
SPACE = str(HERE / "space.yaml")


def command(run_dir, *extra, task=TASK, space=SPACE):
    # float16 too, as on a device with fast float16: the kill tests count trials per config.
    return [sys.executable, "-m", "tuner", "tune", task, "--space", space,
            "--run-dir", str(run_dir), "--out", str(run_dir.parent / "best.json"), "--force",
            "--keep-slow-policies", *extra]


def run(args, fault_name="none", timeout=600):
    env = {**os.environ, "FAULT": fault_name, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=timeout)


def records(run_dir):
    return read_trials(run_dir, "trials.jsonl")


def mlflow_trial_runs(run_dir):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    name = json.loads((run_dir / "run.json").read_text())["experiment"]
    experiment = client.get_experiment_by_name(name)
    return [r for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get("precision_tuner.kind") == "trial"]


@pytest.mark.parametrize("fault_name, executor, failure_class, fragment", [
    ("build", "local", "task_error", "injected fault: build_model failed"),
    ("oom", "local", "out_of_memory", "OOM when allocating"),
    ("segv", "local", "worker_crashed", "worker process crashed"),
    ("segv", "ray", "worker_crashed", "worker process crashed"),
    ("hang", "local", "timeout", "time limit of 20 s"),
])
def test_a_fault_inside_a_trial_fails_that_trial_only(tmp_path, fault, fault_name, executor,
                                                      failure_class, fragment):
    run_dir = tmp_path / "run"
    completed = run(command(run_dir, "--executor", executor, "--time-limit", "20"), fault_name)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    trials = read_trials(run_dir)
    fault["lost"] = 2 - len(trials)
    assert [t["verdict"] for t in trials] == ["stable", "failed"]
    assert trials[1]["result"]["failure_class"] == failure_class
    assert fragment in trials[1]["reason"]
    # The summary explains the failure (the console wraps long lines: compare words).
    assert fragment in " ".join(completed.stdout.split())
    (child,) = [r for r in mlflow_trial_runs(run_dir) if r.data.tags["trial_number"] == "1"]
    assert child.data.tags["failure_class"] == failure_class
    assert child.info.status == "FAILED"


def test_nan_in_the_data_is_refused_before_anything_is_written(tmp_path, fault):
    completed = run(command(tmp_path / "run"), "nan_data")
    fault["lost"] = 0
    assert completed.returncode == 2
    assert "1 NaN/inf value(s) in x of batch 0" in completed.stderr
    assert not (tmp_path / "run").exists()


def _sigint_as_in_a_terminal():
    # A job started with `&` by a non-interactive shell (a CI runner, say) inherits SIGINT as
    # ignored, and Python then never raises KeyboardInterrupt: give the CLI the terminal's default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_until(args, marker, fault_name="none"):
    """Start the CLI; return the process once a line starting with `marker` was printed."""
    env = {**os.environ, "FAULT": fault_name, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, start_new_session=True,
                               preexec_fn=_sigint_as_in_a_terminal)
    for line in process.stdout:
        if line.strip().startswith(marker):
            return process
    raise AssertionError(f"the run ended before {marker!r}: rc={process.wait()}")


SLOW_TASK = str(ROOT / "tests" / "tasks" / "slow_steps.py")
KILL_RUN = ("--executor", "local", "--steps", "12", "--finalists", "1")


def _resume_and_check(run_dir, before, fault, asked=4):
    completed = run(command(run_dir, *KILL_RUN, "--trials", str(asked), task=SLOW_TASK,
                            space="quick"))
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "already finished" in completed.stdout
    after = records(run_dir)
    kept = [r for r in after if r["number"] in {b["number"] for b in before}]
    fault["lost"] = len(before) - sum(1 for b in before if b in kept)
    assert kept == before  # finished trials kept exactly, not re-run
    assert len(after) == asked and sorted(r["number"] for r in after) == list(range(asked))
    return after


def test_sigkill_mid_study_then_resume(tmp_path, fault):
    run_dir = tmp_path / "run"
    args = command(run_dir, *KILL_RUN, "--trials", "4", task=SLOW_TASK, space="quick")
    process = _run_until(args, "#1")
    time.sleep(1.0)  # trial #2 is running now
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    before = records(run_dir)
    assert len(before) == 2
    _resume_and_check(run_dir, before, fault)
    import optuna

    storage = f"sqlite:///{run_dir / 'optuna.db'}"
    study = optuna.load_study(study_name=json.loads((run_dir / "run.json").read_text())
                              ["study_name"], storage=storage)
    states = [t.state.name for t in study.trials]
    assert "RUNNING" not in states and "FAIL" in states  # the killed trial, failed on resume
    killed = [r for r in mlflow_trial_runs(run_dir) if r.info.status == "KILLED"]
    assert len(killed) == 1 and killed[0].data.tags["verdict"] == "killed"


def test_ctrl_c_ends_cleanly_and_leaves_the_study_resumable(tmp_path, fault):
    run_dir = tmp_path / "run"
    args = command(run_dir, *KILL_RUN, "--trials", "4", task=SLOW_TASK, space="quick")
    process = _run_until(args, "#1")
    time.sleep(1.0)
    os.killpg(process.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C
    output = process.stdout.read()
    assert process.wait(timeout=120) == 130, output
    assert "resume with: precision-tuner tune" in output
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    before = records(run_dir)
    _resume_and_check(run_dir, before, fault)


def test_a_newer_config_schema_is_refused_by_export(tmp_path, fault):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = run_dir / "best_precision.json"
    config.write_text(json.dumps({"schema_version": 7, "policy": "float32"}))
    completed = run([sys.executable, "-m", "tuner", "export", "--run-dir", str(run_dir)])
    fault["lost"] = 0
    assert completed.returncode == 2
    assert "schema_version 7 is newer" in completed.stderr
    assert json.loads(config.read_text())["schema_version"] == 7  # untouched
