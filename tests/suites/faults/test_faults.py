"""Faults injected end to end against the real CLI: nothing recorded may be lost.

Each test accounts for the run directories it made (``fault.account``, see ``accounting``):
every trial handed to a worker must be in trials.jsonl, Optuna and MLflow with one verdict, or
closed there as killed. The session's last line is computed from those accounts. The kills a
resume must repair are in ``test_kill_resume`` (its own module, so xdist runs it beside this).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import not_injectable
from tests.suites.faults.accounting import mlflow_trial_numbers
from tests.suites.faults.cli_runs import (
    KILL_RUN,
    ROOT,
    SLOW_TASK,
    _free_port,
    _run_until,
    assert_accounted,
    command,
    fault_env,
    mlflow_trial_runs,
    run,
)
from tests.support.records import read_trials

pytestmark = pytest.mark.system


@pytest.mark.parametrize("fault_name, executor, failure_class, fragment", [
    ("build", "local", "task_error", "injected fault: build_model failed"),
    ("oom", "local", "out_of_memory", "OOM when allocating"),
    ("segv", "local", "worker_crashed", "worker process crashed"),
    ("segv", "ray", "worker_crashed", "worker process crashed"),
    ("hang", "local", "timeout", "time limit of 20 s"),
    ("hang", "ray", "timeout", "time limit of 20 s"),
])
def test_a_fault_inside_a_trial_fails_that_trial_only(tmp_path, fault, fault_name, executor,
                                                      failure_class, fragment):
    run_dir = tmp_path / "run"
    completed = run(command(run_dir, "--executor", executor, "--time-limit", "20"), fault_name)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    trials = read_trials(run_dir)
    assert_accounted(fault, run_dir, finished=2)
    assert [t["verdict"] for t in trials] == ["stable", "failed"]
    assert trials[1]["result"]["failure_class"] == failure_class
    assert fragment in trials[1]["reason"]
    # The summary explains the failure (the console wraps long lines: compare words).
    assert fragment in " ".join(completed.stdout.split())
    (child,) = [r for r in mlflow_trial_runs(run_dir) if r.data.tags["trial_number"] == "1"]
    assert child.data.tags["failure_class"] == failure_class
    assert child.info.status == "FAILED"


def test_nan_in_the_data_is_refused_before_anything_is_written(tmp_path, fault):
    completed = run(command(tmp_path / "run", "--executor", "local"), "nan_data")
    assert_accounted(fault, tmp_path / "run", finished=0)
    assert completed.returncode == 2
    assert "1 NaN/inf value(s) in x (the first in row 5)" in completed.stderr
    assert not (tmp_path / "run").exists()



def test_a_newer_config_schema_is_refused_by_export(tmp_path, fault):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = run_dir / "best_precision.json"
    config.write_text(json.dumps({"schema_version": 7, "policy": "float32"}))
    completed = run([sys.executable, "-m", "tuner", "export", "--run-dir", str(run_dir)])
    assert_accounted(fault, run_dir, finished=0)
    assert completed.returncode == 2
    assert "schema_version 7 is newer" in completed.stderr
    assert json.loads(config.read_text())["schema_version"] == 7  # untouched


# -- the float32 baseline itself fails --------------------------------------------------------

def test_a_float32_baseline_that_diverges_ends_the_job_clearly_with_records_intact(tmp_path,
                                                                                   fault):
    run_dir = tmp_path / "run"
    completed = run(command(run_dir, "--executor", "local", "--steps", "12"), "baseline_nan")
    assert completed.returncode == 1, completed.stdout[-2000:] + completed.stderr[-2000:]
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith("precision-tuner: failed: the float32 baseline trial did not train "
                           "stably (loss non-finite at step ") \
        and "Check the task with plain float32" in line, line
    assert not (tmp_path / "best.json").exists()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    assert not (run_dir / "trials.jsonl").exists()  # a resume starts from a new baseline
    accounting = assert_accounted(fault, run_dir, finished=0)
    assert accounting.started == [0] and accounting.ended == [0]
    (child,) = mlflow_trial_runs(run_dir)
    assert child.data.tags["verdict"] == "unstable" and child.info.status == "FINISHED"


# -- faults during the re-measurement ---------------------------------------------------------

@pytest.mark.parametrize("fault_name, executor, why", [
    ("remeasure_segv", "local", "worker process crashed"),
    ("remeasure_segv", "ray", "worker process crashed"),
    ("remeasure_hang", "local", "time limit of 20 s"),
])
def test_a_finalist_lost_in_the_re_measurement_is_named_and_float32_wins(tmp_path, fault,
                                                                         fault_name, executor,
                                                                         why):
    run_dir = tmp_path / "run"
    completed = run(command(run_dir, "--executor", executor, "--steps", "12", "--time-limit",
                            "20"), fault_name, fault_dir=tmp_path)
    output = completed.stdout[-3000:] + completed.stderr[-3000:]
    assert completed.returncode == 0, output
    # The search's trial built it once and the re-measurement trained that live model on,
    # where it struck.
    assert (tmp_path / "builds-mixed_bfloat16").read_text() == "x", output
    assert (tmp_path / "struck").is_file(), output   # the fault struck (else: what ran)
    assert (tmp_path / "struck").read_text() == fault_name, output
    words = " ".join(completed.stdout.split())
    assert "lost #1 (mixed_bfloat16" in words and why in words, output
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["policy"] == "float32"
    accounting = assert_accounted(fault, run_dir, finished=2)
    assert 1 in accounting.remeasured and accounting.remeasured.count(0) >= 2



# -- the kernel's OOM killer -------------------------------------------------------------------

def _own_memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory controller folder, where a child group can be made."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return folder if (folder / "memory.limit_in_bytes").is_file() else None
    return None


@pytest.fixture
def memory_limited(tmp_path):
    """A child memory cgroup of this process's own, limited to 3 GiB (the driver and its
    TensorFlow worker need about 1.2 GiB): what runs in it is OOM-killed there, never the
    machine's memory exhausted."""
    parent = _own_memory_cgroup()
    if parent is None:
        not_injectable("no cgroup v1 memory controller here to limit a worker's memory")
    group = parent / f"precision-tuner-fault-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(3 * 2**30))
    except OSError as exc:
        not_injectable(f"cannot make a memory-limited cgroup: {exc}")
    yield group
    deadline = time.monotonic() + 30
    while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.5)
    group.rmdir()


def test_a_worker_killed_by_the_oom_killer_fails_that_trial_only(memory_limited, tmp_path,
                                                                 fault):
    run_dir = tmp_path / "run"

    def enter_the_group():
        (memory_limited / "cgroup.procs").write_text(str(os.getpid()))

    completed = subprocess.run(command(run_dir, "--executor", "local", "--steps", "12"),
                               cwd=ROOT, capture_output=True, text=True, timeout=600,
                               env=fault_env("oom_kill"), preexec_fn=enter_the_group)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    oom = dict(line.split() for line in (memory_limited / "memory.oom_control").read_text()
               .splitlines())
    assert int(oom["oom_kill"]) >= 1  # the kernel's OOM killer did it, not Python
    trials = read_trials(run_dir)
    assert [t["verdict"] for t in trials] == ["stable", "failed"]
    assert trials[1]["result"]["failure_class"] == "worker_crashed"
    assert "exit code -9" in trials[1]["reason"]
    assert_accounted(fault, run_dir, finished=2)


# -- MLflow going away mid-run -----------------------------------------------------------------


@pytest.fixture
def tracking_server(tmp_path):
    """An MLflow tracking server on a free local port (its store a SQLite file)."""
    import urllib.request

    port, store = _free_port(), tmp_path / "server.db"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{store}",
         "--artifacts-destination", str(tmp_path / "server-artifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "no MLflow server"
            time.sleep(0.5)
    yield server, f"http://127.0.0.1:{port}", f"sqlite:///{store}"
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_mlflow_going_away_mid_run_stops_no_trial_and_the_loss_is_stated(tmp_path, fault,
                                                                         tracking_server):
    server, uri, store = tracking_server
    run_dir = tmp_path / "run"
    env = {**fault_env("none"), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    args = command(run_dir, *KILL_RUN, "--trials", "3", "--tracking-uri", uri,
                   task=SLOW_TASK, space="quick")
    process = _run_until(args, "#0", env=env)
    os.killpg(server.pid, signal.SIGKILL)  # the server, mid-run
    server.wait()
    output = process.stdout.read()
    assert process.wait(timeout=300) == 0, output
    words = " ".join(output.split())
    assert "MLflow failed during the run" in words and "the trials went on" in words, output
    assert (tmp_path / "best.json").is_file()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "finished" and 2 in run["mlflow_missing"]
    assert f"Trials missing from MLflow: {', '.join(f'#{n}' for n in run['mlflow_missing'])}" \
        in words
    # The server's own store holds every trial the run did not list, with its verdict.
    accounting = assert_accounted(fault, run_dir, finished=3, mlflow_uri=store)
    assert accounting.stated == run["mlflow_missing"]
    _missing_is_what_mlflow_lacks(run_dir, run, store)



def _immutable(path: Path, on: bool) -> bool:
    """``chattr +i``: not even root may write the file (chmod does not stop root)."""
    flag = "+i" if on else "-i"
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_a_read_only_mlflow_store_mid_run_stops_no_trial_and_the_loss_is_stated(tmp_path,
                                                                                fault):
    probe = tmp_path / "probe"
    probe.touch()
    if not (_immutable(probe, True) and _immutable(probe, False)):
        not_injectable("chattr +i is not available here (root on ext4 and alike)")
    run_dir = tmp_path / "run"
    process = _run_until(command(run_dir, *KILL_RUN, "--trials", "3", task=SLOW_TASK,
                                 space="quick"), "#0")
    store = run_dir / "mlflow.db"
    assert _immutable(store, True)  # the store turns read-only mid-run
    try:
        output = process.stdout.read()
        returncode = process.wait(timeout=300)
    finally:
        _immutable(store, False)
    assert returncode == 0, output
    words = " ".join(output.split())
    assert "MLflow failed during the run" in words and "the trials went on" in words, output
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "finished" and 2 in run["mlflow_missing"]
    assert (tmp_path / "best.json").is_file()
    accounting = assert_accounted(fault, run_dir, finished=3)
    assert accounting.stated == run["mlflow_missing"]
    _missing_is_what_mlflow_lacks(run_dir, run, f"sqlite:///{store}")


def _missing_is_what_mlflow_lacks(run_dir: Path, run: dict, uri: str) -> None:
    """The run's list of trials MLflow misses is exactly what MLflow, read independently,
    lacks: no trial it holds is listed, none it lacks is left out."""
    finished = {t["number"] for t in read_trials(run_dir)}
    held = mlflow_trial_numbers(uri, run_dir)
    assert held <= finished
    assert sorted(finished - held) == sorted(run["mlflow_missing"]), (held, run)

# -- a Ray node lost mid-trial -----------------------------------------------------------------

def _ray_node(*args, env):
    """``ray start --block`` in its own process group (ending the group ends that node only;
    `ray stop` would end every Ray instance on the machine), on loopback."""
    return subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--block",
                             "--num-cpus", "1", "--node-ip-address", "127.0.0.1",
                             "--dashboard-agent-listen-port", str(_free_port()),
                             "--disable-usage-stats", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _end(process):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def two_node_cluster():
    """A head and a worker node on this machine, one CPU each; the head notices a dead node
    within a few seconds (Ray's default health check takes about half a minute)."""
    import shutil
    import socket
    import tempfile

    port, temp_dir = _free_port(), tempfile.mkdtemp(prefix="pt-ray-")
    env = {**fault_env("none"), "RAY_health_check_period_ms": "500", "RAY_AUTH_MODE": "disabled",
           "RAY_health_check_timeout_ms": "1000", "RAY_health_check_failure_threshold": "3"}
    env.pop("RAY_ADDRESS", None)
    head = _ray_node("--head", "--port", str(port), "--include-dashboard", "false",
                     "--ray-client-server-port", str(_free_port()), "--temp-dir", temp_dir,
                     env=env)
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            break
        except OSError:
            assert head.poll() is None and time.monotonic() < deadline, "no Ray head"
            time.sleep(0.5)
    worker = _ray_node("--address", f"127.0.0.1:{port}", env=env)
    try:
        yield f"127.0.0.1:{port}", worker
    finally:
        _end(worker)
        _end(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_ray_node_lost_mid_trial_has_its_trial_run_again_and_the_job_finishes(
        tmp_path, fault, two_node_cluster):
    address, worker_node = two_node_cluster
    run_dir = tmp_path / "run"
    args = command(run_dir, "--executor", "ray", "--ray-address", address, "--workers", "2",
                   "--steps", "30", "--finalists", "1", "--trials", "4",
                   task=SLOW_TASK, space="quick")
    process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**fault_env("none"), "RAY_AUTH_MODE": "disabled"},
                               start_new_session=True)
    submitted = run_dir / "submitted.jsonl"
    deadline = time.monotonic() + 300
    # Trials #1 and #2 run side by side, one on each node (one CPU each): end the worker node.
    # Each lasts 30 slow steps (about 2.5 s), so the end lands while they run.
    while not (submitted.is_file() and len(submitted.read_text().splitlines()) >= 3):
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.1)
    time.sleep(0.5)
    _end(worker_node)
    output = process.stdout.read()
    assert process.wait(timeout=300) == 0, output
    run = json.loads((run_dir / "run.json").read_text())
    (loss,) = run["node_losses"]
    lost = int(loss.split("during trial #")[1].split(";")[0])
    assert lost in (1, 2), loss
    # Trials ran on both nodes, and the lost trial's record comes from its run on the other.
    lost_node, node_of = loss.split()[1], {t["number"]: t["result"]["node"]
                                           for t in read_trials(run_dir)}
    assert node_of[lost] != lost_node, (loss, node_of)
    assert len(set(node_of.values()) | {lost_node}) == 2, (loss, node_of)
    assert "was lost during trial" in " ".join(output.split())
    again = [json.loads(line) for line in submitted.read_text().splitlines()
             if json.loads(line).get("requeued")]
    assert [line["number"] for line in again] == [lost]
    trials = read_trials(run_dir)
    assert all(t["verdict"] != "failed" for t in trials), [t["reason"] for t in trials]
    assert (tmp_path / "best.json").is_file()
    assert_accounted(fault, run_dir, finished=4)
