"""What the fault tests share: the CLI run with a fault injected (``FAULT``), its records, and
the slow-step run that is killed mid-trial. Each test accounts for the run directories it made
(``fault.account``, see ``accounting``)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.support.records import read_trials

HERE = Path(__file__).parent
TASK = str(HERE / "faulty_task.py")
SPACE = str(HERE / "space.yaml")


def command(run_dir, *extra, task=TASK, space=SPACE):
    # float16 too, as on a device with fast float16: the kill tests count trials per config.
    return [sys.executable, "-m", "tuner", "tune", task, "--space", space,
            "--run-dir", str(run_dir), "--out", str(run_dir.parent / "best.json"), "--force",
            "--keep-slow-policies", *extra]


def fault_env(fault_name, fault_dir=None):
    env = {**os.environ, "FAULT": fault_name, "PYTHONUNBUFFERED": "1"}
    if fault_dir is not None:
        env["FAULT_DIR"] = str(fault_dir)
    return env


def run(args, fault_name="none", timeout=600, fault_dir=None):
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                          env=fault_env(fault_name, fault_dir), timeout=timeout)


def assert_accounted(fault, run_dir, finished=None, mlflow_uri=None):
    """Account for ``run_dir``: nothing lost; ``finished`` trials in every record."""
    accounting = fault.account(run_dir, mlflow_uri)
    assert not accounting.lost, accounting.describe()
    if finished is not None:
        assert accounting.finished == list(range(finished)), accounting.describe()
    return accounting


def records(run_dir):
    return read_trials(run_dir, "trials.jsonl")


def mlflow_trial_runs(run_dir):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    name = json.loads((run_dir / "run.json").read_text())["experiment"]
    experiment = client.get_experiment_by_name(name)
    return [r for r in client.search_runs([experiment.experiment_id])
            if r.data.tags.get("precision_tuner.kind") == "trial"]


def _sigint_as_in_a_terminal():
    # A job started with `&` by a non-interactive shell (a CI runner, say) inherits SIGINT as
    # ignored, and Python then never raises KeyboardInterrupt: give the CLI the terminal's default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_until(args, marker, fault_name="none", env=None):
    """Start the CLI; return the process once a line starting with `marker` was printed."""
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env or fault_env(fault_name),
                               start_new_session=True, preexec_fn=_sigint_as_in_a_terminal)
    for line in process.stdout:
        if line.strip().startswith(marker):
            return process
    raise AssertionError(f"the run ended before {marker!r}: rc={process.wait()}")


SLOW_TASK = str(ROOT / "tests" / "fixtures" / "tasks" / "slow_steps.py")
KILL_RUN = ("--steps", "12", "--finalists", "1")   # the default executor: the local worker


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
