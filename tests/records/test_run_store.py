"""The run directory's own logs: a line a kill cut short, and the log of submitted specs."""

import json

from tuner.records.run_store import RunStore, SubmissionLog
from tuner.trial_types import TrialSpec


def test_a_last_line_cut_short_is_dropped_before_the_next_append(tmp_path):
    store = RunStore(tmp_path)
    store.append_trial({"number": 0, "verdict": "stable"})
    with open(tmp_path / "trials.jsonl", "a") as handle:
        handle.write('{"number": 1, "verd')  # the kill struck here
    assert store.repair_trials_log() is True
    store.append_trial({"number": 1, "verdict": "failed"})
    assert [r["number"] for r in store.read_trials()] == [0, 1]
    assert store.repair_trials_log() is False  # an intact log is left alone
    assert (tmp_path / "trials.jsonl").read_text().count("\n") == 2


def test_every_submitted_spec_is_one_line(tmp_path):
    log = SubmissionLog(tmp_path / "submitted.jsonl")
    spec = TrialSpec(number=3, task_path="t.py", config={"policy": "float32"}, steps=12,
                     warmup_steps=2)
    log.write(spec, "search")
    log.write(spec, "re-measurement")
    lines = [json.loads(line) for line in (tmp_path / "submitted.jsonl").read_text()
             .splitlines()]
    assert [(line["number"], line["phase"]) for line in lines] == [(3, "search"),
                                                                   (3, "re-measurement")]
    assert lines[0]["config"] == {"policy": "float32"} and lines[0]["steps"] == 12
