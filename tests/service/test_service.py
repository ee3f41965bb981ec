"""The tuning service for real, on loopback: a Ray head with its job server and an
``mlflow server``, started and stopped by this module through the CLI.

Jobs run side by side and export configs, a job is stopped mid-run and resumed, a crashing
task fails only its own job, a finished job's config is fetched by a fresh process, bad input
is refused at submit time, and a service with authentication refuses requests without its
token.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, TASKS

pytestmark = pytest.mark.system

# A job to stop mid-run: five trials of the slow-step task after its baseline (20 steps of 80 ms
# each: over 8 s in all), so the stop lands in the search however fast the rest of the job has
# become. With the default space this task has two configs, and the job could end between a
# trial and the stop.
STOPPABLE = ("--space", str(ROOT / "tests" / "fixtures" / "spaces" / "six_alike.yaml"),
             "--trials", "6", "--steps", "20", "--finalists", "1")
# The side-by-side jobs: four trials of six configs that cost what float32 costs.
SIDE_BY_SIDE = ("--space", str(ROOT / "tests" / "fixtures" / "spaces" / "six_alike.yaml"),
                "--trials", "4", "--steps", "10")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli(*args, env=None, timeout=300):
    """``precision-tuner ARGS`` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
                               **(env or {})})


class Service:
    def __init__(self, folder: Path, auth: bool = False, warm: bool = True) -> None:
        self.dir = folder
        self.warm = warm
        self.ports = {"--ray-port": _free_port(), "--dashboard-port": _free_port(),
                      "--mlflow-port": _free_port()}
        self.address = f"http://127.0.0.1:{self.ports['--dashboard-port']}"
        self.tracking_uri = f"http://127.0.0.1:{self.ports['--mlflow-port']}"
        self.auth = auth
        self.env = {"PRECISION_TUNER_SERVICE": self.address}

    def start(self):
        args = ["service", "start", "--dir", str(self.dir), "--num-cpus", "2"]
        for flag, port in self.ports.items():
            args += [flag, str(port)]
        return cli(*args, *(["--auth"] if self.auth else []),
                   *([] if self.warm else ["--warm-workers", "0"]), timeout=180)

    def stop(self):
        return cli("service", "stop", "--dir", str(self.dir), timeout=120)

    def run(self, *args, **kwargs):
        return cli(*args, env={**self.env, **kwargs.pop("env", {})}, **kwargs)

    def client(self, token: bool = False):
        from ray.job_submission import JobSubmissionClient

        headers = None
        if token:
            headers = {"Authorization": f"Bearer {self.env['PRECISION_TUNER_TOKEN']}"}
        return JobSubmissionClient(self.address, headers=headers)

    def submit(self, task: str, *flags: str) -> str:
        done = self.run("submit", str(TASKS / f"{task}.py"), *flags)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]

    def wait(self, job_id: str, timeout: float = 400, client=None) -> str:
        client, deadline = client or self.client(), time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = client.get_job_status(job_id)
            if status.is_terminal():
                return status.value
            time.sleep(1)
        raise AssertionError(f"job {job_id} still {status.value} after {timeout} s:\n"
                             + client.get_job_logs(job_id)[-3000:])

    def mlflow(self):
        from mlflow import MlflowClient

        return MlflowClient(self.tracking_uri)

    def parent_run(self, job_id: str):
        client = self.mlflow()
        experiments = [e.experiment_id for e in client.search_experiments()
                       if e.name.startswith("precision-tuner/")]
        runs = [r for r in client.search_runs(experiments)
                if job_id in r.data.tags.get("precision_tuner.job_ids", "").split(",")]
        assert len(runs) == 1, f"{len(runs)} parent runs for {job_id}"
        return runs[0]

    def run_dir(self, job_id: str) -> Path:
        return self.dir / "jobs" / job_id / "run"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    service = Service(tmp_path_factory.mktemp("service") / "svc")
    began = time.monotonic()
    started = service.start()
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        service.start_s = time.monotonic() - began
        service.start_output = started.stdout
        assert service.address in started.stdout and service.tracking_uri in started.stdout
        yield service
    finally:
        stopped = service.stop()
        assert stopped.returncode == 0, stopped.stderr
        info = json.loads((service.dir / "service.json").read_text())
        for pid in (info["ray_pid"], info["mlflow_pid"]):
            assert pid == 0


@pytest.fixture(scope="module")
def side_by_side(service):
    """Two tuning jobs and a crashing one, submitted at once. The tuning jobs search
    six_alike (``SIDE_BY_SIDE``), whose float32 variants cost what float32 costs: each job
    has finalists to re-measure on any CPU (the default space's 16-bit configs can all be
    clearly slower than float32, as on an AMD EPYC without AVX-512, and a job then times
    nothing)."""
    jobs = [service.submit("tiny_mlp", *SIDE_BY_SIDE) for _ in range(2)]
    crashing = service.submit("broken_build", "--trials", "3", "--steps", "10")
    statuses = {job: service.wait(job) for job in [*jobs, crashing]}
    return jobs, crashing, statuses


def test_a_second_start_says_it_is_running_and_changes_nothing(service):
    before = (service.dir / "service.json").read_text()
    again = service.start()
    assert again.returncode == 0
    assert "already running" in again.stdout and "nothing changed" in again.stdout
    assert (service.dir / "service.json").read_text() == before


def test_two_jobs_side_by_side_finish_and_export_a_config(service, side_by_side):
    jobs, _, statuses = side_by_side
    assert [statuses[job] for job in jobs] == ["SUCCEEDED", "SUCCEEDED"], [
        service.client().get_job_logs(job)[-3000:] for job in jobs]
    listing = service.run("jobs")
    assert listing.returncode == 0, listing.stderr
    for job in jobs:
        line = next(line for line in listing.stdout.splitlines() if line.startswith(job))
        assert "tiny_mlp.py" in line and "SUCCEEDED" in line
        assert re.search(r" (\d+)/\1 ", line), line     # every trial of its plan finished
        parent = service.parent_run(job)
        tags = parent.data.tags
        assert tags["precision_tuner.job_id"] == job
        flags = tags["precision_tuner.flags"]
        assert "--trials 4" in flags and "--steps 10" in flags and "six_alike.yaml" in flags
        assert tags["precision_tuner.submitted_by"] == service.client().get_job_info(
            job).metadata["submitted_by"]
        assert parent.info.status == "FINISHED"
        names = [a.path for a in service.mlflow().list_artifacts(parent.info.run_id)]
        assert {"best_precision.json", "summary.html", "trials_table.json"} <= set(names)
        experiment = service.mlflow().get_experiment(parent.info.experiment_id)
        assert experiment.name == "precision-tuner/tiny_mlp"
        assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_two_jobs_never_time_their_finalists_on_one_node_at_once(service, side_by_side):
    jobs, _, _ = side_by_side
    phases = []
    for job in jobs:
        record = json.loads((service.run_dir(job) / "run.json").read_text())
        assert record["exclusive_phases"], f"{job} recorded no exclusive phase"
        phases += [(job, phase) for phase in record["exclusive_phases"]]
    assert all(phase["exclusive"] for _, phase in phases)
    for index, (job_a, a) in enumerate(phases):
        for job_b, b in phases[index + 1:]:
            if job_a != job_b and a["node"] == b["node"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    # A job that asked for the node while another job held it waited, and said so.
    for job, phase in phases:
        if phase["start"] - phase["requested"] > 4:
            assert "precision-tuner: waiting for a node" in service.client().get_job_logs(job)


def test_a_crashing_task_fails_its_own_job_with_the_reason(service, side_by_side):
    _, crashing, statuses = side_by_side
    assert statuses[crashing] == "FAILED"
    shown = service.run("status", crashing)
    assert shown.returncode == 0, shown.stderr
    assert f"job {crashing}: FAILED" in shown.stdout
    assert "reason: precision-tuner: error: build_model() in broken_build.py raised " \
           "RuntimeError: oops: this model cannot be built" in shown.stdout


def test_fetch_from_a_fresh_process_after_the_job_ended(service, side_by_side, tmp_path):
    job = side_by_side[0][0]
    out = tmp_path / "best.json"
    fetched = service.run("fetch", job, "--out", str(out))
    assert fetched.returncode == 0, fetched.stderr
    assert json.loads(out.read_text()) == json.loads(
        (service.run_dir(job) / "best_precision.json").read_text())
    again = service.run("fetch", job, "--out", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_stop_mid_run_keeps_finished_trials_and_resume_continues(service, side_by_side):
    job = service.submit("slow_steps", *STOPPABLE)
    client, deadline = service.client(), time.monotonic() + 300
    trials_log = service.run_dir(job) / "trials.jsonl"
    while time.monotonic() < deadline:  # stop once a trial is finished, while the next runs
        if trials_log.is_file() and trials_log.read_text().count("\n") >= 1:
            break
        assert not client.get_job_status(job).is_terminal(), client.get_job_logs(job)[-3000:]
        time.sleep(0.5)
    stopped = service.run("stop", job)
    assert stopped.returncode == 0, stopped.stderr
    assert service.wait(job, timeout=30) == "STOPPED"
    record = json.loads((service.run_dir(job) / "run.json").read_text())
    assert record["status"] == "interrupted"
    kept = [json.loads(line)["number"] for line in trials_log.read_text().splitlines()]
    assert kept and kept[0] == 0
    parent = service.parent_run(job)
    assert parent.info.status == "KILLED"
    assert parent.data.tags["precision_tuner.job_status"] == "stopped"
    children = service.mlflow().search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert "RUNNING" not in {run.info.status for run in children}
    assert sum(run.info.status == "FINISHED" for run in children) == len(kept)

    resumed = service.submit("slow_steps", "--resume", job)
    assert service.wait(resumed) == "SUCCEEDED", client.get_job_logs(resumed)[-3000:]
    numbers = [json.loads(line)["number"]
               for line in trials_log.read_text().splitlines()]
    assert numbers[:len(kept)] == kept and len(numbers) == len(set(numbers))
    assert service.parent_run(resumed).info.run_id == parent.info.run_id
    assert f"resuming {service.run_dir(job)}: {len(kept)} of" in client.get_job_logs(resumed)


def _pool(service, settled=lambda text: True, timeout=90.0) -> str:
    """``service status``'s text, once ``settled(text)`` (the keeper replaces workers in the
    background)."""
    deadline = time.monotonic() + timeout
    while True:
        shown = service.run("service", "status", "--dir", str(service.dir))
        assert shown.returncode == 0, shown.stderr
        if settled(shown.stdout) or time.monotonic() > deadline:
            return shown.stdout
        time.sleep(1)


def _all_back(text: str) -> bool:
    return "warm workers: 3 (0 starting)" in text and "0 busy, 0 lent between trials, 2 idle" \
        in text


def test_jobs_run_in_the_spare_drivers_and_each_one_taken_is_replaced(service, side_by_side):
    assert "spare drivers: 2 ready, 0 running a job, 0 starting" in service.start_output
    jobs, crashing, _ = side_by_side      # three at once: two find a spare, the third may not
    handed = [job for job in [*jobs, crashing] if "runs in one of the service's spare "
              "drivers" in service.client().get_job_logs(job)]
    assert len(handed) >= 2, handed
    deadline = time.monotonic() + 60
    while "spare drivers: 2 ready, 0 running a job" not in service.run("service", "status",
                                                                      "--dir", str(service.dir)
                                                                      ).stdout:
        assert time.monotonic() < deadline, "the spares taken were not replaced"
        time.sleep(1)


def test_jobs_borrow_the_warm_workers_and_give_them_all_back(service, side_by_side):
    jobs, crashing, _ = side_by_side
    for job in [*jobs, crashing]:
        assert "this job borrows them, TensorFlow already imported" in \
            service.client().get_job_logs(job)
    shown = _pool(service, _all_back)
    assert _all_back(shown), shown
    assert re.search(r"node \w{8}: 2 slots: 0 busy, 0 lent between trials, 2 idle; timing: -",
                     shown), shown


def test_the_pool_times_the_ceiling_at_start_so_a_first_job_does_not_wait_on_it(
        service, side_by_side):
    assert re.search(r"the device's ceiling timed in 2 of them \([\d.]+ s\), so no job "
                     "waits on it", service.start_output), service.start_output
    jobs, _, _ = side_by_side              # the service's first jobs: each borrowed a worker
    for job in jobs:                       # that had not run a job before
        ceiling = json.loads((service.run_dir(job) / "run.json").read_text())["ceiling"]
        assert ceiling["reused"] is True and ceiling["peak"]["speed"]["float32"] == 1.0
        assert (f"measured them before this job, at {ceiling['measured_at']})"
                in service.client().get_job_logs(job))


CRASH_UNDER_BF16 = """
import ctypes

import keras
import numpy as np

LOSS = "mse"


def build_model():
    if keras.config.dtype_policy().name == "mixed_bfloat16":
        ctypes.string_at(0)           # SIGSEGV: the worker process dies
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(inputs)))


def train_data():
    x = np.random.default_rng(0).normal(size=(320, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)
"""


def test_a_warm_worker_that_crashed_is_replaced(service, side_by_side, tmp_path):
    task = tmp_path / "crash_bf16.py"
    task.write_text(CRASH_UNDER_BF16)
    done = service.run("submit", str(task), "--space",
                       str(ROOT / "tests" / "suites" / "faults" / "space.yaml"),
                       "--keep-slow-policies")
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().splitlines()[-1]
    assert service.wait(job) == "SUCCEEDED", service.client().get_job_logs(job)[-3000:]
    trials = [json.loads(line) for line in
              (service.run_dir(job) / "trials.jsonl").read_text().splitlines()]
    assert [t["verdict"] for t in trials] == ["stable", "failed"]
    assert trials[1]["result"]["failure_class"] == "worker_crashed"
    shown = _pool(service, _all_back)    # the crashed worker's successor is warm and idle
    assert _all_back(shown), shown


def test_a_killed_jobs_warm_workers_come_back(service, side_by_side):
    job = service.submit("slow_steps", *STOPPABLE)
    trials_log = service.run_dir(job) / "trials.jsonl"
    deadline = time.monotonic() + 300
    while not (trials_log.is_file() and trials_log.read_text().count("\n") >= 1):
        assert time.monotonic() < deadline, service.client().get_job_logs(job)[-3000:]
        time.sleep(0.5)
    busy = _pool(service)
    assert re.search(r"2 slots: 1 busy, 0 lent between trials, 1 idle|2 slots: 0 busy, "
                     r"1 lent between trials, 1 idle", busy), busy
    pids = subprocess.run(["pgrep", "-f", f"jobs/{job}/run"], capture_output=True,
                          text=True).stdout.split()
    drivers = [pid for pid in pids if "tuner" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(drivers) == 1, pids
    os.kill(int(drivers[0]), 9)          # no time to give anything back
    shown = _pool(service, _all_back)
    assert _all_back(shown), shown
    assert service.wait(job, timeout=60) == "FAILED"


def test_bad_input_is_refused_at_submit_time_like_tune(service, side_by_side, tmp_path):
    before = {j.submission_id for j in service.client().list_jobs()}
    cases = [[str(tmp_path / "missing.py")],
             [str(TASKS / "tiny_mlp.py"), "--space", "nope"],
             [str(TASKS / "tiny_mlp.py"), "--exhaustive", "--trials", "3"]]
    for case in cases:
        submitted = service.run("submit", *case)
        tuned = cli("tune", *case, "--run-dir", str(tmp_path / "never"))
        assert submitted.returncode == tuned.returncode == 2, submitted.stderr
        lines = submitted.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("precision-tuner: error: ")
        assert lines == tuned.stderr.strip().splitlines()
    assert {j.submission_id for j in service.client().list_jobs()} == before
    assert not (tmp_path / "never").exists()


def test_with_authentication_a_request_without_the_token_is_refused(tmp_path):
    """Also, with authentication on: a job logs to the authenticated MLflow, `service stop`
    stops it first, and after a restart (Ray forgot the job) it resumes and is fetched from
    MLflow. This service keeps no warm workers: each job starts its own, and re-measures in a
    placement group that reserves the node (the other services here lend warm workers)."""
    service = Service(tmp_path / "svc", auth=True, warm=False)
    started = service.start()
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        token_file = service.dir / "auth_token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        refused = service.run("submit", str(TASKS / "tiny_mlp.py"))
        assert refused.returncode == 2
        assert "refused the request: it requires authentication" in refused.stderr
        wrong = service.run("jobs", env={"PRECISION_TUNER_TOKEN": "0" * 64})
        assert wrong.returncode == 2 and "the token was not accepted" in wrong.stderr
        with pytest.raises(urllib.error.HTTPError) as denied:  # MLflow asks too
            urllib.request.urlopen(f"{service.tracking_uri}/api/2.0/mlflow/experiments/search"
                                   "?max_results=1", timeout=10)
        assert denied.value.code == 401
        allowed = service.run("jobs", "--token-file", str(token_file))
        assert allowed.returncode == 0 and "no jobs yet" in allowed.stdout

        service.env["PRECISION_TUNER_TOKEN"] = token_file.read_text().strip()
        job = service.submit("slow_steps", *STOPPABLE)
        trials_log = service.run_dir(job) / "trials.jsonl"
        deadline = time.monotonic() + 300
        while not (trials_log.is_file() and trials_log.read_text().count("\n") >= 1):
            assert time.monotonic() < deadline, "no trial finished in 300 s"
            time.sleep(0.5)
        stopped = service.stop()                  # stops the running job first
        assert stopped.returncode == 0, stopped.stderr
        record = json.loads((service.run_dir(job) / "run.json").read_text())
        assert record["status"] == "interrupted"
        kept = len(trials_log.read_text().splitlines())

        service.ports = {flag: _free_port() for flag in service.ports}
        service.address = f"http://127.0.0.1:{service.ports['--dashboard-port']}"
        service.tracking_uri = f"http://127.0.0.1:{service.ports['--mlflow-port']}"
        service.env["PRECISION_TUNER_SERVICE"] = service.address
        restarted = service.start()
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        resumed = service.submit("slow_steps", "--resume", job)   # Ray forgot: from MLflow
        assert service.wait(resumed, client=service.client(token=True)) == "SUCCEEDED"
        # ... with every flag it was submitted with, its space file's copy included.
        command = service.client(token=True).get_job_info(resumed).entrypoint
        assert "--finalists 1" in command and "--trials 6" in command, command
        assert f"/jobs/{job}/task/six_alike.yaml" in command, command
        logs = service.client(token=True).get_job_logs(resumed)   # its own workers, cold
        assert "borrows them" not in logs and "re-measuring the finalists on node" in logs
        assert "(warm timing worker)" not in logs
        numbers = [json.loads(line)["number"] for line in trials_log.read_text().splitlines()]
        assert len(numbers) >= kept and len(numbers) == len(set(numbers))
        out = tmp_path / "best.json"
        fetched = service.run("fetch", job, "--out", str(out))    # the first job's id
        assert fetched.returncode == 0, fetched.stderr
        assert json.loads(out.read_text()) == json.loads(
            (service.run_dir(job) / "best_precision.json").read_text())
    finally:
        assert service.stop().returncode == 0


def test_the_service_ui_shows_both_jobs_trials_side_by_side(service, side_by_side):
    from tests.e2e.test_ui_browser import (
        _close_side_panel,
        _require_browser,
        _screenshot,
        _wait_for_text,
    )

    _require_browser()
    jobs, _, _ = side_by_side
    shown = service.run("ui", "--no-browser")
    assert shown.returncode == 0, shown.stderr
    link = next(line.split(": ", 1)[1] for line in shown.stdout.splitlines()
                if line.strip().startswith("precision-tuner/tiny_mlp:"))
    parents = [service.parent_run(job) for job in jobs]
    (experiment_id,) = {parent.info.experiment_id for parent in parents}
    assert link.startswith(f"{service.tracking_uri}/#/experiments/{experiment_id}/runs?")
    runs = service.mlflow().search_runs([experiment_id])
    trials = [r for r in runs if r.data.tags["precision_tuner.kind"] == "trial"]
    assert {r.data.tags["precision_tuner.job_id"] for r in trials} == set(jobs)
    # First view, no columns added: every run by name, the job ids on the tuning jobs, and each
    # trial's verdict and speedup in its name.
    for run in trials:
        figures = run.info.run_name.split(" · ")[0]
        assert figures.startswith(f"#{run.data.tags['trial_number']} "
                                  f"{run.data.tags['verdict']}"), run.info.run_name
        speedup = run.data.metrics.get("speedup_vs_float32")
        assert speedup is None or f"{speedup:.2f}x" in figures, run.info.run_name
    browser = _browser()
    try:
        browser.get(link)
        text = _wait_for_text(browser, [*jobs, *{r.info.run_name for r in trials},
                                        f"{len(runs)} matching runs"])
        assert re.search(r"#\d+ stable \d\.\d\dx [\d.]+ ms · ", text)
        _close_side_panel(browser)
        _screenshot(browser, "mlflow_service_two_jobs.png")
        browser.get(f"{service.tracking_uri}/#/experiments/{experiment_id}/runs/"
                    f"{parents[0].info.run_id}/artifacts/summary.html")
        _wait_for_text(browser, ["summary.html"])
        frame = _wait_for_frame(browser)
        browser.switch_to.frame(frame)
        table = _wait_for_text(browser, ["verdict", "speedup_vs_float32", "median_step_ms"])
        assert "float32" in table
        browser.switch_to.default_content()
        _screenshot(browser, "mlflow_summary_table.png")
    finally:
        browser.quit()


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as Driver

    from tests.e2e.test_ui_browser import CHROME_FLAGS, _require_browser

    chromium, chromedriver = _require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Driver(chromedriver))


def _wait_for_frame(driver, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frames = [f for f in driver.find_elements("tag name", "iframe") if f.is_displayed()]
        if frames:
            return frames[0]
        time.sleep(0.5)
    raise AssertionError("the summary table's frame never appeared:\n"
                         + driver.find_element("tag name", "body").text[:2000])
