"""The fault accounting can fail: a record dropped on purpose is reported as a lost trial."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.suites.faults.accounting import Accounting, account
from tests.suites.faults.cli_runs import SPACE, TASK
from tests.suites.faults.conftest import Fault, summary_line

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """One small run with no fault: #0 float32 and #1 mixed_bfloat16, both finished."""
    tmp = tmp_path_factory.mktemp("accounting")
    run_dir = tmp / "run"
    completed = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", TASK, "--space", SPACE, "--run-dir",
         str(run_dir), "--out", str(tmp / "best.json"), "--executor", "local", "--steps", "12",
         "--keep-slow-policies"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    return run_dir


def copy_of(run_dir, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


def test_a_clean_run_is_fully_accounted_for(clean_run):
    accounting = account(clean_run)
    assert accounting.started == [0, 1] and accounting.finished == [0, 1]
    assert accounting.lost == {}


def _drop_trials_line(run_dir):
    log = run_dir / "trials.jsonl"
    log.write_text("".join(line for line in log.read_text().splitlines(keepends=True)
                           if json.loads(line)["number"] != 1))


def _drop_mlflow_run(run_dir):
    from mlflow import MlflowClient

    record = next(json.loads(line) for line in (run_dir / "trials.jsonl").read_text()
                  .splitlines() if json.loads(line)["number"] == 1)
    MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}").delete_run(record["run_id"])


def _flip_optuna_state(run_dir):
    import optuna
    from optuna.trial import TrialState

    run = json.loads((run_dir / "run.json").read_text())
    storage = optuna.storages.RDBStorage(f"sqlite:///{run_dir / 'optuna.db'}")
    study_id = storage.get_study_id_from_name(run["study_name"])
    trial = next(t for t in storage.get_all_trials(study_id) if t.user_attrs.get("trial") == 1)
    # Rewrite the told state behind Optuna's back (it refuses to re-tell a finished trial).
    import sqlalchemy

    engine = sqlalchemy.create_engine(f"sqlite:///{run_dir / 'optuna.db'}")
    state = TrialState.FAIL if trial.state is not TrialState.FAIL else TrialState.COMPLETE
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("UPDATE trials SET state = :state WHERE trial_id = "
                                           ":id"), {"state": state.name, "id": trial._trial_id})
    engine.dispose()


def _drop_submission(run_dir):
    log = run_dir / "submitted.jsonl"
    log.write_text("".join(line for line in log.read_text().splitlines(keepends=True)
                           if not (json.loads(line)["number"] == 1
                                   and json.loads(line)["phase"] == "search")))


@pytest.mark.parametrize("drop, why", [
    (_drop_trials_line, "started, not in trials.jsonl, but MLflow says"),
    (_drop_mlflow_run, "but not in MLflow"),
    (_flip_optuna_state, "Optuna says"),
    (_drop_submission, "never handed to a worker"),
])
def test_a_dropped_record_is_reported_as_a_lost_trial(clean_run, tmp_path, drop, why):
    run_dir = copy_of(clean_run, tmp_path)
    drop(run_dir)
    accounting = account(run_dir)
    assert list(accounting.lost) == [1], accounting.describe()
    assert why in accounting.lost[1]
    assert accounting.finished == [0]
    # ... and the suite's summary line says so.
    record = Fault("dropped")
    record.accounts.append(accounting)
    record.passed = True
    assert summary_line([record]) == \
        "faults injected: 1, survived: 0, trials lost: 1, skipped: 0"


def test_a_fault_this_machine_cannot_inject_counts_as_skipped_only():
    survived, skipped = Fault("killed worker"), Fault("no cgroup here")
    survived.accounts.append(Accounting(run_dir=Path("run")))
    survived.passed = True
    skipped.skipped = True   # nothing accounted: would otherwise count one lost trial
    assert summary_line([survived, skipped]) == \
        "faults injected: 1, survived: 1, trials lost: 0, skipped: 1"
