"""The service's queue for real, on loopback: a service that runs one job at a time (one warm
worker), loaded as a team loads it. Jobs beyond its turn wait QUEUED in the order they came,
with no process; a killed Ray head loses none of them (the running one resumes from its
finished trials); a queued job can be stopped, and a second resume of a job whose resumption
waits is refused; two submitters at once each get their own job; one submitter over the
queued limit is refused while another is not; ``service stop`` with jobs queued, then
``service start``, runs them all."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.service.test_service import STOPPABLE, Service

pytestmark = pytest.mark.system
TINY = ("--trials", "2", "--steps", "10")


class OneAtATime(Service):
    def start(self):
        args = ["service", "start", "--dir", str(self.dir), "--num-cpus", "2",
                "--warm-workers", "1", "--max-queued-per-user", "4"]
        for flag, port in self.ports.items():
            args += [flag, str(port)]
        from tests.service.test_service import cli

        return cli(*args, timeout=240)

    def statuses(self, jobs: list[str]) -> dict[str, str]:
        client = self.client()
        return {job: client.get_job_status(job).value for job in jobs}

    def wait_all(self, jobs: list[str], timeout: float = 600) -> dict[str, str]:
        """Every job's end; asserts on the way that no two ran at once."""
        deadline, seen_running = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            statuses = self.statuses(jobs)
            running = sum(state == "RUNNING" for state in statuses.values())
            seen_running = max(seen_running, running)
            assert running <= 1, statuses
            if all(state in ("SUCCEEDED", "FAILED", "STOPPED") for state in statuses.values()):
                return statuses
            time.sleep(1)
        raise AssertionError(f"not all ended after {timeout} s: {self.statuses(jobs)}")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    service = OneAtATime(tmp_path_factory.mktemp("queue") / "svc")
    started = service.start()
    assert started.returncode == 0, started.stdout + started.stderr
    assert "jobs at once: 1 (the rest wait queued" in started.stdout
    try:
        yield service
    finally:
        stopped = service.stop()
        assert stopped.returncode == 0, stopped.stderr


def _head_pid(service) -> int:
    return json.loads((service.dir / "service.json").read_text())["ray_pid"]


def _finished_trials(service, job: str) -> list[int]:
    log = service.run_dir(job) / "trials.jsonl"
    if not log.is_file():
        return []
    return [json.loads(line)["number"] for line in log.read_text().splitlines() if line]


def test_a_killed_head_loses_no_job_and_the_running_one_keeps_its_trials(service):
    running = service.submit("slow_steps", *STOPPABLE)
    queued = [service.submit("tiny_mlp", *TINY) for _ in range(3)]
    shown = service.run("jobs")
    assert shown.returncode == 0, shown.stderr
    for place, job in enumerate(queued, start=1):
        assert f"QUEUED ({place} of 3)" in next(line for line in shown.stdout.splitlines()
                                                if line.startswith(job)), shown.stdout
    status = service.run("status", queued[1])
    assert f"job {queued[1]}: QUEUED, 2 of 3 in line" in status.stdout, status.stdout
    assert "waits for: one of the service's 1 job turn(s)" in status.stdout
    # a queued job holds no process: no driver of it runs
    assert not any(job.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
                   for pid in os.listdir("/proc") if pid.isdigit()
                   and Path(f"/proc/{pid}/cmdline").exists() for job in queued)

    deadline = time.monotonic() + 300
    while len(_finished_trials(service, running)) < 2:     # the baseline and one more
        assert time.monotonic() < deadline, service.client().get_job_logs(running)[-3000:]
        assert service.statuses([running])[running] == "RUNNING"
        time.sleep(0.5)
    kept = _finished_trials(service, running)
    os.killpg(_head_pid(service), signal.SIGKILL)           # the head dies, no warning

    restarted = service.start()
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert "ended uncleanly" in restarted.stdout
    order = [line.split(":")[0].strip() for line in restarted.stdout.splitlines()
             if line.startswith("    ") and ": " in line]
    assert order == [running, *queued], restarted.stdout
    assert f"{running}: resumes its run" in restarted.stdout

    statuses = service.wait_all([running, *queued])
    assert set(statuses.values()) == {"SUCCEEDED"}, {
        job: service.client().get_job_logs(job)[-2000:] for job in statuses}
    numbers = _finished_trials(service, running)
    assert numbers[:len(kept)] == kept and len(numbers) == len(set(numbers)) > len(kept)
    assert "resuming" in service.client().get_job_logs(running)
    for job in [running, *queued]:                           # each job's config fetched
        out = service.dir / f"{job}.json"
        fetched = service.run("fetch", job, "--out", str(out))
        assert fetched.returncode == 0, fetched.stderr
        assert json.loads(out.read_text())["policy"]


def test_a_queued_job_stopped_never_runs_and_a_waiting_resume_is_not_doubled(service):
    first = service.submit("slow_steps", *STOPPABLE)
    deadline = time.monotonic() + 300
    while not _finished_trials(service, first):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert service.run("stop", first).returncode == 0
    assert service.wait(first, timeout=90) == "STOPPED"
    blocker = service.submit("slow_steps", *STOPPABLE)       # holds the one turn
    resumed = service.submit("slow_steps", "--resume", first)   # waits behind it
    again = service.run("submit", str(Path(__file__).parents[1] / "fixtures" / "tasks"
                                      / "slow_steps.py"), "--resume", first)
    assert again.returncode == 2
    assert f"--resume {first}: job {resumed} already resumes it (pending)" in again.stderr
    doomed = service.submit("tiny_mlp", *TINY)
    stopped = service.run("stop", doomed)
    assert stopped.returncode == 0 and "taken out of the queue" in stopped.stdout
    shown = service.run("jobs").stdout
    assert "STOPPED (left the queue)" in next(line for line in shown.splitlines()
                                             if line.startswith(doomed)), shown
    assert "QUEUED (1 of 1)" in next(line for line in shown.splitlines()
                                     if line.startswith(resumed)), shown
    service.run("stop", blocker)
    statuses = service.wait_all([blocker, resumed, doomed])
    assert statuses[resumed] == "SUCCEEDED"
    assert statuses[doomed] in ("STOPPED", "SUCCEEDED")       # ended when its turn came
    assert not service.run_dir(doomed).exists()                # without running anything


def test_two_submitters_at_once_and_the_per_submitter_limit(service):
    results: dict[str, object] = {}

    def submit(user: str, index: int) -> None:
        results[f"{user}{index}"] = service.run("submit", str(Path(__file__).parents[1]
                                                              / "fixtures" / "tasks"
                                                              / "tiny_mlp.py"), *TINY,
                                                env={"USER": user, "LOGNAME": user})

    blocker = service.submit("slow_steps", *STOPPABLE)
    deadline = time.monotonic() + 120
    while not (service.run_dir(blocker) / "run.json").is_file():   # its run has begun
        assert time.monotonic() < deadline
        time.sleep(0.5)
    threads = [threading.Thread(target=submit, args=(user, i)) for user in ("ana", "ben")
               for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    jobs = {key: done.stdout.strip().splitlines()[-1] for key, done in results.items()
            if done.returncode == 0}
    assert len(jobs) == 4 and len(set(jobs.values())) == 4, {
        key: done.stderr for key, done in results.items()}
    for i in (2, 3, 4):
        submit("ana", i)
    assert results["ana2"].returncode == 0 and results["ana3"].returncode == 0
    over = results["ana4"]
    assert over.returncode == 2
    assert "ana already has 4 jobs queued on this service" in over.stderr
    submit("ben", 2)
    assert results["ben2"].returncode == 0              # another submitter is not held back
    everyone = [*jobs.values(), *(results[key].stdout.split()[-1]
                                  for key in ("ana2", "ana3", "ben2"))]
    submitted_by = {info.submission_id: (info.metadata or {}).get("submitted_by")
                    for info in service.client().list_jobs()}
    assert sorted(submitted_by[job] for job in everyone) == ["ana"] * 4 + ["ben"] * 3

    # the service stopped with all of them queued behind the blocker, then started again
    assert service.stop().returncode == 0
    restarted = service.start()
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert f"{blocker}: resumes its run" in restarted.stdout
    statuses = service.wait_all([blocker, *everyone], timeout=900)
    assert set(statuses.values()) == {"SUCCEEDED"}, statuses
