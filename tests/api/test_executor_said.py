"""What a tune runs its trials on, as the job starts it (tuner.api.job ``_executor``): the
executor the choice names, the console line that says it, and what run.json and MLflow are
given (``executor.chosen``). No worker is started here: the local executor starts its process
on the first trial, and Ray's executor is replaced by a stand-in that records its start.
The real tune checks the same on its records (tests/e2e/test_e2e.py)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tuner.api import job
from tuner.execution.choice import ExecutorChoice
from tuner.execution.local import LocalProcessExecutor

LOCAL = ExecutorChoice("local", 1, "one trial at a time on this machine: no Ray to start")
RAY = ExecutorChoice("ray", 2, "--workers 2: trials side by side")


class _RayStandIn:
    started: list[dict] = []

    def __init__(self, workers=1, address=None, **options):
        self.workers, self.warm = workers, False
        _RayStandIn.started.append({"workers": workers, "address": address})


@pytest.fixture
def said(monkeypatch):
    monkeypatch.setattr(job, "RayExecutor", _RayStandIn)
    _RayStandIn.started = []
    out = io.StringIO()
    console = Console(file=out, width=200)

    def start(choice):
        executor = job._executor(choice, None, console)
        return executor, out.getvalue()
    return start


def test_the_local_choice_runs_the_local_worker_and_records_local(said):
    """Mutation caught: the job records "ray" in run.json while running on the local worker
    (tuner/api/job.py ``_executor``); and the choice ignored, Ray started for every tune."""
    executor, output = said(LOCAL)
    try:
        assert type(executor) is LocalProcessExecutor and _RayStandIn.started == []
        assert executor.chosen == {"kind": "local", "workers": 1, "why": LOCAL.why}
        assert output.splitlines()[0] == f"trials: {LOCAL.line()}"
        assert "starting Ray" not in output and len(output.splitlines()) == 1
    finally:
        executor.close()


def test_the_ray_choice_starts_ray_and_records_ray(said):
    executor, output = said(RAY)
    assert isinstance(executor, _RayStandIn) and _RayStandIn.started == [
        {"workers": 2, "address": None}]
    assert executor.chosen == {"kind": "ray", "workers": 2, "why": RAY.why}
    assert output.splitlines()[0] == f"trials: {RAY.line()}"
    assert "starting Ray workers on a local Ray instance" in output
