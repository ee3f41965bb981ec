"""The service and job commands without a cluster: argument handling, refusals, the job's
entrypoint and tags, the MLflow layout tag and summary table (tests/service/ runs them real)."""

import json
import os
import socket
import stat
import subprocess
import sys
import time

import pytest
import requests

from tests.conftest import ROOT, TASKS
from tuner import job_context
from tuner.cli import submit as job_commands
from tuner.cli.app import build_parser, main
from tuner.errors import UsageError
from tuner.service import client as jobs
from tuner.service import server as service


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("case", [
    ["tests/fixtures/tasks/no_such_task.py"],
    ["tests/fixtures/tasks/tiny_mlp.py", "--space", "nope"],
    ["tests/fixtures/tasks/tiny_mlp.py", "--exhaustive", "--trials", "3"],
    ["tests/fixtures/tasks/tiny_mlp.py", "--trials", "0"],
])
def test_submit_refuses_bad_input_before_contacting_the_service(case, capsys):
    # The address leads nowhere: a refusal must come from the input checks, not the network.
    try:
        code = main(["submit", *case, "--service", f"http://127.0.0.1:{_closed_port()}"])
    except SystemExit as exc:  # argparse's own refusals (same one-line form, exit 2)
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("precision-tuner")
    assert "cannot reach" not in err[0]


def test_submit_and_tune_give_the_same_one_line_message(tmp_path):
    submitted = run_cli("submit", str(TASKS / "tiny_mlp.py"), "--space", "nope",
                        "--service", "http://127.0.0.1:1")
    tuned = run_cli("tune", str(TASKS / "tiny_mlp.py"), "--space", "nope",
                    "--run-dir", str(tmp_path / "run"))
    assert submitted.returncode == tuned.returncode == 2
    assert submitted.stderr == tuned.stderr
    assert submitted.stderr.startswith("precision-tuner: error: unknown search space 'nope'")


def test_job_commands_need_a_service_address(capsys, monkeypatch):
    monkeypatch.delenv(jobs.SERVICE_ENV, raising=False)
    assert main(["jobs"]) == 2
    assert "no service address: pass --service" in capsys.readouterr().err


def test_an_unreachable_service_is_one_line_and_exit_2(capsys):
    assert main(["status", "some-job", "--service", f"127.0.0.1:{_closed_port()}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach the service at --service http://127.0.0.1:" in err[0]


def test_submit_forwards_only_the_tune_flags_given():
    parser = build_parser()
    args = parser.parse_args(["submit", "t.py", "--trials", "5", "--keep-slow-policies",
                              "--space", "default", "--worker-cpus", "2"])
    assert job_commands.forwarded_flags(args) == [
        "--space", "default", "--trials", "5", "--keep-slow-policies"]
    assert args.worker_cpus == 2 and args.resume_job is None
    confirming = parser.parse_args(["submit", "t.py", "--confirm-steps", "300", "--no-confirm"])
    assert job_commands.forwarded_flags(confirming) == [
        "--confirm-steps", "300", "--no-confirm"]   # the confirmation's flags reach the job


def test_resume_takes_the_job_s_own_flags(capsys):
    code = main(["submit", str(TASKS / "tiny_mlp.py"), "--resume", "old-job", "--trials", "4",
                 "--service", "http://127.0.0.1:1"])
    assert code == 2
    assert "--resume old-job continues that job with its own flags; drop --trials 4" in \
        capsys.readouterr().err


def test_a_driver_left_from_a_killed_head_is_ended_before_its_job_is_queued_again(tmp_path):
    """Ray starts an entrypoint in a session of its own, so it outlives the head's processes:
    the restart ends that session (the driver and its child) before the job runs again."""
    from tuner.service import job_book

    intake = tmp_path / "queue" / "job-1"
    intake.mkdir(parents=True)
    driver = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', "
                               "'import time; time.sleep(120)']); time.sleep(120)",
                               "tuner.cli.handoff"], start_new_session=True)
    (intake / job_book.DRIVER_PID).write_text(f"{driver.pid}\n")
    job = job_book.BookedJob("job-1", intake, tmp_path / "jobs" / "job-1", {}, 0.0)
    time.sleep(0.5)
    assert job_book.end_leftover_driver(job)
    assert driver.wait(timeout=20) is not None
    assert not (intake / job_book.DRIVER_PID).exists()
    listed = subprocess.run(["pgrep", "-s", str(driver.pid)], capture_output=True, text=True)
    left = [pid for pid in listed.stdout.split() if service.alive(int(pid))]
    assert left == []                                      # its child went with it
    # a pid since taken by another process is left alone
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    (intake / job_book.DRIVER_PID).write_text(f"{other.pid}\n")
    assert not job_book.end_leftover_driver(job)
    assert other.poll() is None
    other.kill()


def test_job_tags_come_from_the_job_environment(monkeypatch):
    for name in (job_context.JOB_ID_ENV, job_context.RESUMES_ENV):
        monkeypatch.delenv(name, raising=False)
    assert job_context.parent_tags() == {}
    monkeypatch.setenv(job_context.JOB_ID_ENV, "t-2")
    monkeypatch.setenv(job_context.SUBMITTER_ENV, "ada")
    monkeypatch.setenv(job_context.FLAGS_ENV, json.dumps(["--trials", "4"]))
    tags = job_context.parent_tags("t-1")
    assert tags == {"precision_tuner.job_id": "t-2", "precision_tuner.job_ids": "t-1,t-2",
                    "precision_tuner.submitted_by": "ada", "precision_tuner.flags": "--trials 4"}


def test_the_token_file_is_readable_by_its_owner_only(tmp_path):
    token = service.ensure_token(tmp_path)
    path = service.token_path(tmp_path)
    assert len(token) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert service.ensure_token(tmp_path) == token      # created once


def test_binding_beyond_loopback_turns_authentication_on(tmp_path):
    info = service.ServiceInfo(dir=str(tmp_path), host="127.0.0.1", ray_port=1,
                               dashboard_port=2, mlflow_port=3, auth=False, ray_temp_dir="/t")
    env = service._environment(tmp_path, info, None)
    assert env["RAY_AUTH_MODE"] == "disabled" and "MLFLOW_TRACKING_PASSWORD" not in env
    env = service._environment(tmp_path, info, "secret")
    assert env["RAY_AUTH_MODE"] == "token" and env["MLFLOW_TRACKING_PASSWORD"] == "secret"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "auth_token")
    assert env["RAY_JOB_STOP_SIGNAL"] == "SIGINT"


def test_service_start_refuses_a_port_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_cli("service", "start", "--dir", str(tmp_path / "svc"), "--mlflow-port",
                       str(port), "--ray-port", str(_closed_port()), "--dashboard-port",
                       str(_closed_port()))
    assert done.returncode == 2
    assert done.stderr.strip() == (f"precision-tuner: error: port {port} (--mlflow-port) on "
                                   f"127.0.0.1 is already in use. Pass another --mlflow-port, or "
                                   "stop what listens there.")
    assert not (tmp_path / "svc" / "service.json").exists()


@pytest.mark.parametrize("flags, message", [
    (["--ray-port", "12000"], "--ray-port 12000 lies in Ray's worker-port range (10002-19999), "
     "which the head reserves for its workers, so it would exit at start. Pass a port outside "
     "it, e.g. 6379 (the default)."),
    (["--mlflow-port", "70000"], "--mlflow-port 70000 is not a port (at most 65535). Pass a "
     "port from 1024 to 65535."),
    (["--ray-port", "{free}", "--mlflow-port", "{free}"], "--ray-port and --mlflow-port are "
     "both {free}; each service needs its own port. Pass another one for either."),
])
def test_service_start_refuses_a_port_that_cannot_work_before_starting(tmp_path, flags,
                                                                        message):
    free = str(_closed_port())
    done = run_cli("service", "start", "--dir", str(tmp_path / "svc"),
                   *[flag.format(free=free) for flag in flags])
    assert done.returncode == 2
    assert done.stderr.strip() == "precision-tuner: error: " + message.format(free=free)
    assert not (tmp_path / "svc" / "service.json").exists()
    assert not (tmp_path / "svc" / "logs").exists()         # nothing was started


def test_service_status_and_stop_when_nothing_runs(tmp_path):
    status = run_cli("service", "status", "--dir", str(tmp_path))
    assert status.returncode == 3 and "not running" in status.stdout
    stop = run_cli("service", "stop", "--dir", str(tmp_path))
    assert stop.returncode == 0 and "not running" in stop.stdout


@pytest.mark.slow   # MLflow's server started: the quick tier keeps its five minutes
def test_experiments_open_in_the_model_training_layout(tmp_path):
    from mlflow import MlflowClient

    from tuner.records.mlflow_records import Tracker
    from tuner.records.mlflow_stores import default_tracking_uri

    uri = default_tracking_uri(tmp_path)
    Tracker(uri, tmp_path, "precision-tuner/new")
    client = MlflowClient(uri)
    old = client.create_experiment("precision-tuner/old")      # made by an older version
    Tracker(uri, tmp_path, "precision-tuner/old")
    for name in ("precision-tuner/new", "precision-tuner/old"):
        tags = client.get_experiment_by_name(name).tags
        assert tags["mlflow.experimentKind"] == "custom_model_development", name
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"


def test_trial_names_and_the_summary_table_show_verdict_speedup_and_median():
    from tuner.apply.config import PrecisionConfig
    from tuner.records.mlflow_text import table_html, trial_run_name

    config = PrecisionConfig.from_dict({"policy": "mixed_bfloat16"})
    assert trial_run_name(number=3, config=config, verdict="stable", speedup=1.4234,
                          median_ms=12.34) == "#3 stable 1.42x 12.3 ms · mixed_bfloat16"
    assert trial_run_name(number=4, config=config, verdict="failed", speedup=None,
                          median_ms=None) == "#4 failed · mixed_bfloat16"
    html = table_html({"trial": [0, 1], "verdict": ["stable", "<b>"],
                       "speedup_vs_float32": [1.0, None]})
    assert "<th>verdict</th>" in html and "<td>&lt;b&gt;</td>" in html
    assert html.count("<tr>") == 3 and "<td>-</td>" in html


def test_waiting_for_a_node_is_said_once_and_ends_at_the_limit(monkeypatch):
    import ray

    from tuner.execution.ray_pool import RayExecutor

    class Group:
        def ready(self):
            return "ref"

    answers = iter([False, False, True])

    def fake_get(ref, timeout=None):
        assert ref == "ref" and timeout <= 3.0
        if not next(answers):
            raise ray.exceptions.GetTimeoutError()
        return None

    monkeypatch.setattr(ray, "get", fake_get)
    executor = RayExecutor.__new__(RayExecutor)
    said: list[str] = []
    executor.announce, executor.node_wait_s = said.append, 60.0
    assert executor._wait_for(Group()) is True
    assert len(said) == 1 and said[0].startswith("waiting for a node")

    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: (_ for _ in ()).throw(
        ray.exceptions.GetTimeoutError()))
    executor.node_wait_s = 0.0
    assert executor._wait_for(Group()) is False


def test_runs_whose_job_died_are_closed_on_the_next_jobs(tmp_path, capsys):
    """A parent run left RUNNING by a job whose driver is gone (stopped, failed, or forgotten
    by a restarted cluster) is closed, with its running trials; a live job's is left alone."""
    from types import SimpleNamespace

    from mlflow import MlflowClient
    from ray.job_submission import JobStatus

    from tuner.service.contract import JOB_KIND

    store = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = store.create_experiment("precision-tuner/tiny_mlp")
    runs = {}
    for job in ("j-stopped", "j-failed", "j-forgotten", "j-live"):
        parent = store.create_run(experiment, tags={job_context.JOB_ID_TAG: job})
        child = store.create_run(experiment, tags={"mlflow.parentRunId": parent.info.run_id})
        runs[job] = (parent.info.run_id, child.info.run_id)
    ray_says = {"j-stopped": JobStatus.STOPPED, "j-failed": JobStatus.FAILED,
                "j-live": JobStatus.RUNNING}

    def get_job_info(job_id):
        if job_id not in ray_says:
            raise RuntimeError(f"Job {job_id} does not exist")
        return SimpleNamespace(status=ray_says[job_id], metadata={"precision_tuner": JOB_KIND})

    service = jobs.Service.__new__(jobs.Service)
    service.address, service._mlflow = "http://127.0.0.1:1", store
    service.jobs = SimpleNamespace(get_job_info=get_job_info)
    lines = service.close_orphans()
    status = {job: [store.get_run(run).info.status for run in pair]
              for job, pair in runs.items()}
    assert status == {"j-stopped": ["KILLED", "KILLED"], "j-failed": ["FAILED", "KILLED"],
                      "j-forgotten": ["FAILED", "KILLED"], "j-live": ["RUNNING", "RUNNING"]}
    assert len(lines) == 3 and "closed job j-forgotten's MLflow run as FAILED: the cluster " \
        "no longer knows the job (it restarted while the job ran)" in lines
    reason = store.get_run(runs["j-stopped"][0]).data.tags["precision_tuner.closed_because"]
    assert reason == "its driver ended (STOPPED) without closing its records"
    assert service.close_orphans() == []                      # closed once


@pytest.mark.parametrize("failure", [
    RuntimeError("Request failed with status code 401: Unauthorized."),
    RuntimeError("Request failed with status code 500: Internal Server Error."),
    TimeoutError("timed out"),
    ConnectionResetError("Connection reset by peer"),
    requests.exceptions.ConnectionError("Max retries exceeded with url: /api/jobs/j-live"),
])
def test_a_job_server_that_does_not_answer_closes_no_run(tmp_path, failure):
    """Only Ray's "does not exist" means an unknown job; a timeout, a refused token or a
    dropped connection is an outage: no run is closed, and the line says why."""
    from types import SimpleNamespace

    from mlflow import MlflowClient

    from tuner.errors import ServiceOutage

    store = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = store.create_experiment("precision-tuner/tiny_mlp")
    parents = [store.create_run(experiment, tags={job_context.JOB_ID_TAG: job}).info.run_id
               for job in ("j-forgotten", "j-live")]

    def get_job_info(job_id):
        if job_id == "j-forgotten":
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not "
                               "exist.")
        raise failure

    service = jobs.Service.__new__(jobs.Service)
    service.address, service._mlflow = "http://127.0.0.1:1", store
    service.jobs = SimpleNamespace(get_job_info=get_job_info)
    lines = service.close_orphans()
    assert [store.get_run(run).info.status for run in parents] == ["RUNNING", "RUNNING"]
    assert len(lines) == 1 and lines[0].startswith("not closing any job's MLflow runs: the "
                                                   "job server at http://127.0.0.1:1 did not "
                                                   "answer about job 'j-live'")
    with pytest.raises(ServiceOutage, match=type(failure).__name__):
        service.job("j-live")
    assert service.job("j-forgotten", required=False) is None
    with pytest.raises(UsageError, match="no tuning job 'j-forgotten'"):
        service.job("j-forgotten")


_NICENESS_PROBE = """
import os, threading
from tuner.run import search_run
def niceness():
    return sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir('/proc/self/task')})
threading.Thread(target=threading.Event().wait, daemon=True).start()   # a second thread
before = niceness()
search_run._step_aside()
print(before, niceness())
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux's per-thread niceness")
@pytest.mark.parametrize("job_id, raised", [("t-1", 10), ("", 0)])
def test_a_service_job_steps_aside_once_its_timings_are_done(job_id, raised):
    """Every thread of a service job's driver lowers its priority after its timed phases;
    outside a service job (a user's script or notebook) nothing changes."""
    env = {**os.environ, job_context.JOB_ID_ENV: job_id}
    shown = subprocess.run([sys.executable, "-c", _NICENESS_PROBE], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    before, after = (json.loads(part + "]") for part in shown.stdout.strip()[:-1].split("] "))
    assert len(before) == 1 and after == [min(19, before[0] + raised)]
