"""``precision-tuner status`` reads a job's state and the queue it stands in from one listing of
the service's jobs, so a job that starts while the command runs is shown as what it is."""

from __future__ import annotations

from argparse import Namespace
from types import SimpleNamespace

import pytest

from tuner.cli import jobs as job_commands
from tuner.service.client import JOB_KIND


def _job(job_id: str, status: str, start: int) -> SimpleNamespace:
    return SimpleNamespace(submission_id=job_id, status=SimpleNamespace(
        value=status, is_terminal=lambda: status in ("SUCCEEDED", "FAILED", "STOPPED")),
        metadata={"precision_tuner": JOB_KIND, "task": "t.py", "submitted_by": "ana",
                  "flags": "-"}, start_time=start, end_time=None, message="")


class _Service:
    """The service as ``status`` sees it: ``job`` answers from one moment, ``tuning_jobs`` from
    a later one (``listings`` in turn), as two reads of a live Ray job server do."""

    record = {"tracking_uri": "http://mlflow", "job_turns": "1"}
    tracking_uri = "http://mlflow"

    def __init__(self, first, listings, stopped=()):
        self.first, self.listings, self.stopped = first, list(listings), set(stopped)

    def job(self, job_id, required=True):
        return self.first

    def tuning_jobs(self):
        return self.listings.pop(0) if len(self.listings) > 1 else self.listings[0]

    def stop_requested(self, job_id):
        return job_id in self.stopped

    def queue(self, jobs):
        return [j for j in jobs if j.status.value == "PENDING"
                and not self.stop_requested(j.submission_id)]

    def progress(self, job_id):
        return {"done": 0, "planned": 3, "best": None, "phase": "trial 1", "parent": None}


def _status(monkeypatch, capsys, service) -> str:
    monkeypatch.setattr(job_commands, "Service", lambda args: service)
    assert job_commands.status(Namespace(job="j2")) == 0
    return capsys.readouterr().out


def test_a_job_that_starts_between_two_reads_is_shown_running_not_stopped(monkeypatch, capsys):
    service = _Service(_job("j2", "PENDING", 2), [[_job("j1", "SUCCEEDED", 1),
                                                    _job("j2", "RUNNING", 2)]])
    out = _status(monkeypatch, capsys, service)
    assert out.startswith("job j2: RUNNING"), out
    assert "STOPPED" not in out and "now: trial 1" in out


@pytest.mark.parametrize("stopped, first_line", [
    ((), "job j2: QUEUED, 2 of 2 in line"),
    (("j2",), "job j2: STOPPED while it waited")])
def test_a_waiting_job_has_its_place_unless_a_stop_was_asked_for(monkeypatch, capsys, stopped,
                                                                   first_line):
    listing = [_job("j0", "RUNNING", 0), _job("j1", "PENDING", 1), _job("j2", "PENDING", 2)]
    out = _status(monkeypatch, capsys, _Service(listing[2], [listing], stopped))
    assert out.startswith(first_line), out
    if not stopped:
        assert "held by j0" in out and "1 queued job(s) go first" in out
