"""The service's book of jobs (tuner.service.job_book), its limits (tuner.service.limits) and
the entrypoint's part in them (tuner.cli.handoff), on plain folders: what a restart queues
again and in which order, what a job's entrypoint does before and after its driver, the job
turns, the size and per-submitter refusals, and the lock that needs Ray's token auth. The
real queue, restarts included, is in tests/service/test_queue.py."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.cli import handoff
from tuner.errors import UsageError
from tuner.service import job_book
from tuner.service.limits import MIB, ServiceLimits, job_turns
from tuner.service.service_info import check_ray_has_token_auth


def _book(service_dir: Path, job_id: str, submitted_at: float, *, started=False,
          outcome: str | None = None, stopped=False, run_root: Path | None = None):
    intake = job_book.intake_root(service_dir) / job_id
    intake.mkdir(parents=True)
    root = run_root or service_dir / "jobs" / job_id
    request = {"submission_id": job_id, "entrypoint": "exec true",
               "runtime_env": {"env_vars": {job_book.JOB_ROOT_ENV: str(root)}}}
    (intake / job_book.SUBMISSION).write_text(json.dumps(
        {"request": request, "submitted_at": submitted_at}))
    (intake / "task.py").write_text("LOSS = 'mse'\n")
    if started:
        (root / "run").mkdir(parents=True)
        (root / "run" / "run.json").write_text("{}")
    if outcome:
        (intake / job_book.OUTCOME).write_text(json.dumps({"outcome": outcome}))
    if stopped:
        (intake / job_book.STOP_REQUESTED).write_text("stopped\n")
    return intake


def test_a_restart_queues_again_what_had_not_ended_the_started_first(tmp_path):
    _book(tmp_path, "a-succeeded", 1.0, started=True, outcome="succeeded")
    _book(tmp_path, "b-failed", 2.0, started=True, outcome="failed")
    _book(tmp_path, "c-queued", 3.0)
    _book(tmp_path, "d-stopped-while-queued", 4.0, stopped=True)
    _book(tmp_path, "e-killed-with-the-head", 5.0, started=True)
    _book(tmp_path, "f-queued", 6.0)
    _book(tmp_path, "g-stopped-by-the-service", 7.0, started=True, outcome="interrupted")
    _book(tmp_path, "h-stopped-by-a-user", 8.0, started=True, outcome="interrupted",
          stopped=True)
    half = job_book.intake_root(tmp_path) / "i-half-written"
    half.mkdir()
    (half / job_book.SUBMISSION).write_text('{"request": {')   # a submit cut off mid-write
    again = [job.job_id for job in job_book.to_queue_again(tmp_path)]
    assert again == ["e-killed-with-the-head", "g-stopped-by-the-service", "c-queued",
                     "f-queued"]


def test_the_entrypoint_copies_the_books_files_and_resumes_a_run_that_began(tmp_path,
                                                                           monkeypatch):
    intake = _book(tmp_path, "job-1", 1.0)
    (intake / "space.yaml").write_text("policies: [float32]\n")
    root = tmp_path / "jobs" / "job-1"
    monkeypatch.setenv(job_book.JOB_ROOT_ENV, str(root))
    monkeypatch.setenv(job_book.INTAKE_ENV, str(intake))
    ran = []
    monkeypatch.setattr(handoff, "_run", lambda argv: ran.append(argv) or 0)
    assert handoff.main(["tune", f"{root}/task/task.py"]) == 0
    assert ran == [["tune", f"{root}/task/task.py"]]                  # a fresh run
    assert sorted(p.name for p in (root / "task").iterdir()) == ["space.yaml", "task.py"]
    assert json.loads((intake / job_book.OUTCOME).read_text())["outcome"] == "succeeded"
    assert not (intake / job_book.DRIVER_PID).exists()
    # queued again after its run began (a killed head): the same command resumes it, and
    # the copy in the run root (the one the run used) is kept
    (root / "task" / "task.py").write_text("LOSS = 'mae'\n")
    (root / "run").mkdir()
    (root / "run" / "run.json").write_text("{}")
    monkeypatch.setattr(handoff, "_run", lambda argv: ran.append(argv) or 130)
    assert handoff.main(["tune", f"{root}/task/task.py"]) == 130
    assert ran[-1] == ["tune", f"{root}/task/task.py", "--resume"]
    assert (root / "task" / "task.py").read_text() == "LOSS = 'mae'\n"
    assert json.loads((intake / job_book.OUTCOME).read_text())["outcome"] == "interrupted"
    assert [job.job_id for job in job_book.to_queue_again(tmp_path)] == ["job-1"]


@pytest.mark.parametrize("why", ["stopped", "draining"])
def test_a_job_stopped_while_queued_or_whose_turn_comes_as_the_service_stops_never_starts(
        tmp_path, monkeypatch, capsys, why):
    intake = _book(tmp_path, "job-1", 1.0, stopped=why == "stopped")
    if why == "draining":
        (tmp_path / job_book.DRAINING).touch()
    monkeypatch.setenv(job_book.JOB_ROOT_ENV, str(tmp_path / "jobs" / "job-1"))
    monkeypatch.setenv(job_book.INTAKE_ENV, str(intake))
    monkeypatch.setattr(handoff, "_run", lambda argv: pytest.fail("the job started"))
    assert handoff.main(["tune", "t.py"]) == 0
    said = capsys.readouterr().err
    assert ("stopped by a user while it was queued" if why == "stopped"
            else "queued again when the service starts") in said
    assert not (intake / job_book.OUTCOME).exists()    # nothing ran: nothing to record
    # stopped: out of the book; draining: queued again by the next start
    assert [j.job_id for j in job_book.to_queue_again(tmp_path)] == \
        ([] if why == "stopped" else ["job-1"])


@pytest.mark.parametrize("rc, outcome", [(0, "succeeded"), (1, "failed"), (2, "failed"),
                                         (130, "interrupted"), (-2, "interrupted"),
                                         (-9, "failed")])
def test_how_a_driver_ended_is_read_from_its_exit_status(rc, outcome):
    assert job_book.outcome_of(rc) == outcome


@pytest.mark.parametrize("cpus, warm, gpus, asked, turns", [
    (2, None, 0, None, 2),      # one warm worker per CPU: one job each
    (16, 1, 0, None, 1),        # --warm-workers 1: one job at a time
    (8, 0, 0, None, 8),         # no pool: a job's own workers on the CPUs
    (16, None, 4, None, 1),     # a job takes every GPU of the node
    (2, 1, 0, 3, 3),            # --max-running
])
def test_how_many_jobs_run_at_once_follows_the_heads_workers_and_gpus(cpus, warm, gpus, asked,
                                                                      turns):
    assert job_turns(cpus=cpus, warm_workers=warm, gpus=gpus, asked=asked) == turns


def test_a_job_over_the_size_limit_is_refused_naming_it_before_anything_is_sent(tmp_path):
    task, data = tmp_path / "t.py", tmp_path / "t.data.pkl"
    task.write_text("x = 1\n")
    with open(data, "wb") as handle:     # sparse: 3 MiB on paper
        handle.truncate(3 * MIB)
    ServiceLimits(turns=1, max_job_mib=4).check_size([task, data])
    with pytest.raises(UsageError) as refused:
        ServiceLimits(turns=1, max_job_mib=2).check_size([task, data])
    message = str(refused.value)
    assert "\n" not in message
    assert "3.0 MiB (t.data.pkl: 3.0 MiB), over this service's limit of 2 MiB a job " \
        "(service start --max-job-mib)" in message and "shared path" in message


def test_a_submitter_over_the_queued_limit_is_refused_others_are_not():
    jobs = [{"submission_id": f"a{i}", "status": "PENDING",
             "metadata": {"precision_tuner": "job", "submitted_by": "ana"}} for i in range(3)]
    jobs += [{"submission_id": "b0", "status": "PENDING",
              "metadata": {"precision_tuner": "job", "submitted_by": "ben"}},
             {"submission_id": "a-running", "status": "RUNNING",
              "metadata": {"precision_tuner": "job", "submitted_by": "ana"}}]
    stopped: set[str] = set()
    service = SimpleNamespace(server=SimpleNamespace(jobs=lambda: jobs),
                              stop_requested=lambda job_id: job_id in stopped)
    limits = ServiceLimits(turns=1, max_queued_per_user=3)
    limits.check_queued(service, "ben")
    with pytest.raises(UsageError) as refused:
        limits.check_queued(service, "ana")
    assert "ana already has 3 jobs queued on this service" in str(refused.value)
    assert "--max-queued-per-user 3" in str(refused.value)
    stopped.add("a1")                        # stopped while it waited: it does not count
    limits.check_queued(service, "ana")


def test_the_limits_travel_in_the_services_record():
    limits = ServiceLimits(turns=3, max_job_mib=64, max_queued_per_user=5)
    assert ServiceLimits.of(limits.record()) == limits
    assert ServiceLimits.of({}) == ServiceLimits(turns=1)   # a service from before them


@pytest.mark.parametrize("installed, refused", [("2.40.0", True), ("2.51.2", True),
                                                ("2.52.0", False), ("2.60.0", False)])
def test_authentication_is_refused_where_ray_has_no_token_auth(monkeypatch, installed,
                                                               refused):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: installed if name == "ray" else real(name))
    if not refused:
        check_ray_has_token_auth("10.0.0.5")
        return
    for host, flag in (("10.0.0.5", "--host 10.0.0.5"), ("127.0.0.1", "--auth")):
        with pytest.raises(UsageError) as error:
            check_ray_has_token_auth(host)
        message = str(error.value)
        assert message.startswith(f"{flag} needs token authentication, which Ray {installed} "
                                  "does not have (it came in Ray 2.52)")
        assert "pip install 'ray[default]>=2.52'" in message and "\n" not in message


@pytest.mark.parametrize("head_pid, outcome", [("self", "failed"), (0, "interrupted")])
def test_a_driver_that_fails_as_the_head_dies_under_it_is_queued_again(tmp_path, monkeypatch,
                                                                       head_pid, outcome):
    """Ray 2.40's driver exits with an error at once when its head is killed: that job did
    not fail, the cluster went away under it, and the restart queues it again."""
    import os

    intake = _book(tmp_path, "job-1", 1.0, started=True)
    (tmp_path / "service.json").write_text(json.dumps(
        {"ray_pid": os.getpid() if head_pid == "self" else head_pid}))
    monkeypatch.setenv(job_book.JOB_ROOT_ENV, str(tmp_path / "jobs" / "job-1"))
    monkeypatch.setenv(job_book.INTAKE_ENV, str(intake))
    monkeypatch.setattr(handoff, "_run", lambda argv: 1)
    assert handoff.main(["tune", "t.py"]) == 1
    assert json.loads((intake / job_book.OUTCOME).read_text())["outcome"] == outcome
    assert [j.job_id for j in job_book.to_queue_again(tmp_path)] == \
        ([] if outcome == "failed" else ["job-1"])
