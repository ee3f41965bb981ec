"""What a watcher of a service job sees first: the first trial's MLflow run is opened before
the parent run's diagnostics and ceiling are logged (they had put it off by 0.2 s of
requests); and the stores staged while the task is checked (Optuna's alone when the job logs
to a tracking server)."""

from __future__ import annotations

import optuna

from tuner.apply.config import PrecisionConfig
from tuner.records.mlflow_stores import StagedStores
from tuner.records.run_store import RunStore
from tuner.records.timing import TimeBreakdown
from tuner.run.trial_records import TrialRecorder


class _Tracker:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start_trial(self, *, number, **_):
        self.calls.append(f"start_trial {number}")
        return f"run-{number}"

    def log_diagnostics(self, diagnostics):
        self.calls.append("log_diagnostics")

    def log_ceiling(self, ceiling):
        self.calls.append("log_ceiling")


def _recorder(tracker, tmp_path) -> TrialRecorder:
    return TrialRecorder(tracker, RunStore(tmp_path / "run"), None, TimeBreakdown())


def test_the_first_trial_s_run_opens_before_the_parent_s_diagnostics_and_ceiling(tmp_path):
    tracker = _Tracker()
    records = _recorder(tracker, tmp_path)
    records.after_first_trial(tracker.log_diagnostics, {"candidates": []})
    records.after_first_trial(tracker.log_ceiling, {"speed": {}})
    records.trial_started(0, PrecisionConfig(), 0, False)
    records.after_first_trial(tracker.log_ceiling, {"speed": {}})   # later: queued in turn
    records.trial_started(1, PrecisionConfig("mixed_bfloat16"), 1, False)
    records.flush()
    records.close()
    assert tracker.calls == ["start_trial 0", "log_diagnostics", "log_ceiling", "log_ceiling",
                             "start_trial 1"]


def test_a_job_that_runs_no_trial_still_logs_them(tmp_path):
    tracker = _Tracker()
    records = _recorder(tracker, tmp_path)
    records.after_first_trial(tracker.log_diagnostics, {"candidates": []})
    assert tracker.calls == []
    records.flush()
    records.close()
    assert tracker.calls == ["log_diagnostics"]


def test_a_service_job_stages_only_optunas_store(tmp_path):
    staged = StagedStores(mlflow=False)
    staged.move_into(tmp_path / "service-job")
    assert sorted(p.name for p in (tmp_path / "service-job").iterdir()) == ["optuna.db"]
    optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/service-job/optuna.db")
    StagedStores().move_into(tmp_path / "local")
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["mlflow.db", "optuna.db"]
    assert not staged.folder.exists()
