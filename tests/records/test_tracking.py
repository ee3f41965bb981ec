"""Records off the critical path: trials.jsonl at once, MLflow on a background thread; a resume
catches MLflow up with what trials.jsonl has."""

import threading

import pytest

from tuner.apply.config import PrecisionConfig
from tuner.judging.verdict import Judgement, Verdict
from tuner.records.results import TrialRow
from tuner.records.run_store import RunStore
from tuner.records.timing import TimeBreakdown
from tuner.run.trial_records import TrialRecorder as _Records
from tuner.trial_types import TrialOutcome, TrialResult


class SlowTracker:
    """Stands in for MLflow: creating a run is quick, logging a result waits for ``release``."""

    def __init__(self, fail: bool = False) -> None:
        self.release = threading.Event()
        self.logged: list[str] = []
        self.calls: list[str] = []
        self.fail = fail

    def start_trial(self, *, number, **_):
        self.calls.append(f"start-{number}")
        return f"run-{number}"

    def log_trial(self, run_id, **_):
        self.calls.append(f"log-{run_id}")
        self.release.wait(timeout=30)
        if self.fail:
            raise RuntimeError("the tracking store is read-only")
        self.logged.append(run_id)


def row(number: int) -> TrialRow:
    result = TrialResult(number=number, outcome=TrialOutcome.COMPLETED, losses=[1.0, 0.9],
                         step_times_ms=[5.0, 1.0])
    return TrialRow(number, PrecisionConfig(), result, Judgement(Verdict.STABLE, "", 1.0, 1.0))


def test_a_trial_is_on_disk_before_mlflow_has_it_and_the_next_trial_does_not_wait(tmp_path):
    tracker, store = SlowTracker(), RunStore(tmp_path)
    records = _Records(tracker, store, None, TimeBreakdown())
    records.trial_started(0, PrecisionConfig(), 0, repair=False)
    finished = row(0)
    records.trial_finished(finished, 1.0)            # returns while MLflow is still busy
    assert [t["number"] for t in store.read_trials()] == [0]
    assert store.read_trials()[0]["run_id"] == "run-0" == finished.run_id
    assert tracker.logged == []
    records.trial_started(1, PrecisionConfig(), 1, repair=False)  # queued behind it
    tracker.release.set()
    records.flush()
    assert tracker.logged == ["run-0"]
    records.close()


def test_a_finished_trials_record_waits_for_the_next_trials_start(tmp_path):
    """Its per-step series are 0.1-0.3 s of Python on the records' thread: logged at once, they
    held the GIL against the driver's Optuna tell and ask, and the next trial started later."""
    tracker = SlowTracker()
    records = _Records(tracker, RunStore(tmp_path), None, TimeBreakdown())
    records.trial_started(0, PrecisionConfig(), 0, repair=False)
    records.trial_finished(row(0), 1.0)
    # Nothing queued before this probe: a log_trial queued would block it until release.
    assert records.later(lambda: "probe").result(timeout=10) == "probe"
    assert tracker.calls == ["start-0"]
    records.trial_started(1, PrecisionConfig(), 1, repair=False)
    tracker.release.set()
    records.trial_finished(row(1), 1.0)      # the last trial: logged by the flush
    records.flush()
    assert tracker.calls == ["start-0", "start-1", "log-run-0", "log-run-1"]
    assert tracker.logged == ["run-0", "run-1"]
    records.close()


def test_a_failure_to_record_in_mlflow_is_stated_at_the_flush_not_raised(tmp_path):
    # MLflow failing mid-run must not stop the trials (tests/faults: the MLflow outage test).
    tracker = SlowTracker(fail=True)
    tracker.release.set()
    records = _Records(tracker, RunStore(tmp_path), None, TimeBreakdown())
    records.trial_started(0, PrecisionConfig(), 0, repair=False)
    records.trial_finished(row(0), 1.0)
    records.flush()
    (line,) = records.outage_lines()
    assert "RuntimeError: the tracking store is read-only" in line and "#0" in line
    assert [t["number"] for t in RunStore(tmp_path).read_trials()] == [0]
    records.close()


def test_a_resume_keeps_the_open_runs_of_recorded_trials_and_kills_the_others(tmp_path):
    from tuner.records.mlflow_records import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, tmp_path, "precision-tuner/t")
    parent = tracker.start_parent("tune t", params={}, tags={})
    recorded = tracker.start_trial(number=0, config=PrecisionConfig())
    running = tracker.start_trial(number=1, config=PrecisionConfig())

    resumed = Tracker(uri, tmp_path, "precision-tuner/t")
    behind = resumed.resume_parent(parent, recorded={recorded})
    assert behind == {recorded}
    client = resumed.client
    assert client.get_run(recorded).info.status == "RUNNING"   # the caller logs it
    killed = client.get_run(running)
    assert killed.info.status == "KILLED" and killed.data.tags["verdict"] == "killed"


def test_two_jobs_creating_one_experiment_at_once_both_get_it(tmp_path):
    """Two service jobs of the same task start together: both see no experiment, one creates
    it, the server refuses the other's creation (a unique name); that one uses the winner's."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tuner.records.mlflow_records import EXPERIMENT_KIND_TAG, experiment_for

    store = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")

    class LosesTheRace:
        """Sees no experiment at first; its creation then clashes with the other job's."""

        def __init__(self):
            self.looked = 0

        def get_experiment_by_name(self, name):
            self.looked += 1
            return None if self.looked == 1 else store.get_experiment_by_name(name)

        def create_experiment(self, name, **kwargs):
            store.create_experiment(name, **kwargs)          # the other job, just before
            return store.create_experiment(name, **kwargs)   # refused: the name is taken

        def set_experiment_tag(self, *args):
            store.set_experiment_tag(*args)

    with pytest.raises(MlflowException):     # what a plain create does
        LosesTheRace().create_experiment("precision-tuner/x")
    loser = LosesTheRace()
    winner_id = experiment_for(loser, "precision-tuner/tiny_mlp", None)
    experiment = store.get_experiment_by_name("precision-tuner/tiny_mlp")
    assert winner_id == experiment.experiment_id and loser.looked == 2
    assert experiment.tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert experiment_for(store, "precision-tuner/tiny_mlp", None) == winner_id


def test_the_trials_link_ranks_by_the_re_measured_speedup_and_lists_the_rest_after(tmp_path):
    """The UI's "fastest first" link sorts by the figure the pick is decided on, which only
    float32 and the finalists carry: a search run's single speedup (here #2's 3.0x) does not
    put it on top, and MLflow lists the runs without the figure after the ranked ones."""
    import urllib.parse

    from mlflow import MlflowClient

    from tuner.judging.noise import SpeedupEstimate
    from tuner.records.mlflow_records import Tracker
    from tuner.records.mlflow_stores import ui_paths

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, tmp_path, "precision-tuner/x")
    tracker.start_parent("tune x", {}, {})
    runs = {number: tracker.start_trial(number=number, config=PrecisionConfig(policy))
            for number, policy in ((0, "float32"), (1, "mixed_bfloat16"), (2, "mixed_float16"),
                                   (3, "bfloat16"))}
    tracker.log_remeasure(runs[0], 10.0, SpeedupEstimate.identity(4))
    tracker.log_remeasure(runs[1], 8.0, SpeedupEstimate(1.25, 1.2, 1.3, 4))
    tracker.log_remeasure(runs[3], 12.5, SpeedupEstimate(0.8, 0.75, 0.85, 4))
    tracker.client.log_metric(runs[2], "speedup_vs_float32", 3.0)   # a search run, not re-timed

    link = ui_paths(uri, "precision-tuner/x", tracker.parent_id)["trials, fastest first"]
    query = urllib.parse.parse_qs(link.partition("?")[2])
    assert query["orderByKey"] == ["metrics.`remeasured_speedup_vs_float32`"]
    assert query["orderByAsc"] == ["false"]
    listed = MlflowClient(uri).search_runs(
        [tracker.experiment_id], order_by=[f"{query['orderByKey'][0]} DESC"])
    order = [run.info.run_id for run in listed]
    assert order[:3] == [runs[1], runs[0], runs[3]]
    assert set(order[3:]) == {runs[2], tracker.parent_id}
