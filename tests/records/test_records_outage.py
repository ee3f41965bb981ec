"""MLflow failing mid-run: the trials go on, trials.jsonl has every one, the loss is stated."""

from tuner.apply.config import PrecisionConfig
from tuner.judging.verdict import judge
from tuner.records.results import TrialRow
from tuner.records.run_store import RunStore
from tuner.records.timing import TimeBreakdown
from tuner.run.trial_records import TrialRecorder as _Records
from tuner.trial_types import FailureClass, TrialResult


class StoreDiesAfter:
    """A tracker whose store refuses every call after the first ``calls``."""

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.done: list[str] = []

    def _call(self, name: str) -> None:
        if len(self.done) >= self.calls:
            raise ConnectionError("Connection refused")
        self.done.append(name)

    def start_trial(self, *, number, **_):
        self._call(f"start #{number}")
        return f"run-{number}"

    def log_trial(self, run_id, **_):
        self._call(f"log {run_id}")


def _row(number: int) -> TrialRow:
    result = TrialResult.failed(number, FailureClass.TASK_ERROR, "injected")
    return TrialRow(number, PrecisionConfig(), result,
                    judge(result, None, floor=1.0, max_skipped_fraction=0.2,
                          min_loss_decrease_ratio=0.9, expected_steps=10))


def test_trials_go_on_when_mlflow_fails_and_the_missing_ones_are_named(tmp_path):
    # start #1, start #2, log #1 (a trial's record waits for the next trial's start); then the
    # store is gone.
    tracker = StoreDiesAfter(calls=3)
    records = _Records(tracker, RunStore(tmp_path), None, TimeBreakdown())
    for number in (1, 2, 3):
        records.trial_started(number, PrecisionConfig(), None, repair=False)
        records.trial_finished(_row(number), None)
    records.flush()  # an outage is stated, not raised
    records.close()
    assert tracker.done == ["start #1", "start #2", "log run-1"]
    assert [r["number"] for r in RunStore(tmp_path).read_trials()] == [1, 2, 3]
    assert sorted(records.missing) == [2, 3]
    (line,) = records.outage_lines()
    assert "ConnectionError: Connection refused" in line and "#2, #3" in line


def test_without_an_outage_nothing_is_stated(tmp_path):
    tracker = StoreDiesAfter(calls=100)
    records = _Records(tracker, RunStore(tmp_path), None, TimeBreakdown())
    records.trial_started(1, PrecisionConfig(), None, repair=False)
    records.trial_finished(_row(1), None)
    records.flush()
    records.close()
    assert records.missing == [] and records.outage_lines() == []
