"""``precision-tuner service start|stop|status``: the team's tuning service.

The service is nothing home-made: a Ray head node with its job server (Ray's dashboard, which
serves the Job API) and an ``mlflow server`` (SQLite store and artifact root under the service
directory, artifacts served through it). ``precision-tuner submit`` sends jobs to the first;
every job logs to the second.

Layout of the service directory::

    DIR/service.json      addresses, ports, process ids (no secrets)
    DIR/auth_token        the shared secret when bound beyond loopback (mode 0600)
    DIR/mlflow/           mlflow.db, artifacts/, and for authentication auth.ini and auth.db
    DIR/jobs/JOB/         each job's task file and run directory (run.json, trials.jsonl, ...)
    DIR/mlflow/artifacts/queue/JOB/   each job's page in the service's book: its submission,
                          files and outcome (tuner.service.job_book)
    DIR/logs/             ray.log, mlflow.log

The queue: the head offers as many job turns (a custom resource) as it runs jobs at once
(tuner.service.limits); each job asks for one, so Ray's job server keeps the rest PENDING, in
the order they came, with no process. ``service start`` queues again what the book holds
unfinished, so queued and running jobs outlive ``service stop`` and a killed head.

Authentication: on loopback (the default) neither end asks for it; bound elsewhere both do, and
a Ray without token authentication (before 2.52) is refused there.
Ray's job server uses Ray's token authentication (``RAY_AUTH_MODE=token``, the token in
``DIR/auth_token``); MLflow runs its ``basic-auth`` app with the user ``precision-tuner``
and the same token as password. Clients pass the token (``PRECISION_TUNER_TOKEN`` or
``--token-file``); jobs on the cluster inherit it from the head's environment.

The Ray head runs as ``ray start --head --block`` in its own process group: stopping the
service ends that group (Ray's own processes end with it), never ``ray stop``, which would
stop every Ray instance on the machine.

Its record and the host's facts (``ServiceInfo``, service.json, the token file, the port
checks) are tuner.service.service_info's.

Past 300 lines: starting, watching and stopping the service's two processes (the Ray head and
MLflow), its warm workers and spare drivers, and its record in Ray's job store all work on the
one ``ServiceInfo``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuner.errors import TunerError, first_line
from tuner.execution.choice import visible_gpus
from tuner.execution.warm_pool import describe as describe_pool
from tuner.service import job_book, warm_side
from tuner.service.contract import JOB_KIND, MLFLOW_USER, RECORD_JOB, client_for
from tuner.service.job_server import JobServer
from tuner.service.limits import (
    DEFAULT_MAX_JOB_MIB,
    DEFAULT_MAX_QUEUED,
    ServiceLimits,
    job_turns,
)
from tuner.service.service_info import (
    LOOPBACK,
    ServiceInfo,
    alive,
    check_ports,
    check_ray_has_token_auth,
    ensure_token,
    free_port,
    ray_temp_dir,
    read_info,
    running,
    token_path,
    write_info,
)

_START_TIMEOUT_S = 120.0


def _environment(service_dir: Path, info: ServiceInfo, token: str | None) -> dict[str, str]:
    """The head's environment, inherited by every job's entrypoint (``precision-tuner tune``)."""
    env = {**os.environ}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")  # jobs find `precision-tuner`
    env["PRECISION_TUNER_SERVICE_DIR"] = str(service_dir)
    # Stopping a job sends it SIGINT, which `tune` handles like Ctrl-C (records closed as
    # killed, the run resumable), and gives it time to close its records before SIGKILL.
    env["RAY_JOB_STOP_SIGNAL"] = "SIGINT"
    env["RAY_JOB_STOP_WAIT_TIME_S"] = "60"
    # A queued job waits its turn however long the queue is (Ray fails one still PENDING
    # after 15 minutes by default).
    env["RAY_JOB_START_TIMEOUT_SECONDS"] = job_book.START_TIMEOUT_S
    env.pop("RAY_ADDRESS", None)
    for name in ("RAY_AUTH_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(name, None)
    if token is not None:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = str(token_path(service_dir))
        env["MLFLOW_TRACKING_USERNAME"] = MLFLOW_USER
        env["MLFLOW_TRACKING_PASSWORD"] = token
    else:
        env["RAY_AUTH_MODE"] = "disabled"
        env.pop("RAY_AUTH_TOKEN_PATH", None)
    return env


def start(service_dir: Path, host: str = "127.0.0.1", ray_port: int = 6379,
          dashboard_port: int = 8265, mlflow_port: int = 5000, num_cpus: int | None = None,
          auth: bool | None = None, warm_workers: int | None = None,
          limits: dict | None = None, say=print) -> tuple[ServiceInfo, bool]:
    """Start the Ray head and the MLflow server, then queue again the jobs the last run of
    the service left unfinished (tuner.service.job_book); ``(info, False)`` when already
    running. ``limits``: ``max_running``, ``max_job_mib``, ``max_queued_per_user`` as given
    (None: the defaults, tuner.service.limits)."""
    service_dir = service_dir.resolve()
    previous = read_info(service_dir)
    if running(previous):
        return previous, False
    auth = host not in LOOPBACK if auth is None else auth
    if auth:
        check_ray_has_token_auth(host)
    if previous is not None and (alive(previous.ray_pid) or alive(previous.mlflow_pid)
                                 or alive(previous.drivers_pid)):
        # What is left of a service whose head was killed: ended, and started again whole.
        say(f"  the service's last run ended uncleanly (Ray head {_state(previous.ray_pid)}, "
            f"MLflow server {_state(previous.mlflow_pid)}): stopping what was left of it")
        _stop_processes(previous)
    service_dir.mkdir(parents=True, exist_ok=True)
    check_ports(host, {"--ray-port": ray_port, "--dashboard-port": dashboard_port,
                       "--mlflow-port": mlflow_port})
    for sub in ("jobs", "logs", "mlflow"):
        (service_dir / sub).mkdir(exist_ok=True)
    (service_dir / job_book.DRAINING).unlink(missing_ok=True)
    limits = dict(limits or {})
    cpus = num_cpus or os.cpu_count() or 1
    service_limits = ServiceLimits(
        turns=job_turns(cpus=cpus, warm_workers=warm_workers, gpus=visible_gpus(),
                        asked=limits.get("max_running")),
        max_job_mib=limits.get("max_job_mib") or DEFAULT_MAX_JOB_MIB,
        max_queued_per_user=limits.get("max_queued_per_user") or DEFAULT_MAX_QUEUED)
    info = ServiceInfo(dir=str(service_dir), host=host, ray_port=ray_port,
                       dashboard_port=dashboard_port, mlflow_port=mlflow_port, auth=auth,
                       ray_temp_dir=ray_temp_dir(service_dir),
                       started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       warm_workers=warm_workers, limits=service_limits.record())
    token = ensure_token(service_dir) if auth else None
    env = _environment(service_dir, info, token)
    try:
        info.mlflow_pid = _start_mlflow(service_dir, info, env, token)
        info.ray_pid = _start_ray(service_dir, info, env, num_cpus, service_limits.turns)
        write_info(info)
        _wait_until_up(info, token)
        _register(info, token)
        if warm_workers != 0:
            info.pool = warm_side.start_pool(info, env)
            info.drivers_pid = warm_side.start_spares(service_dir, env)
            write_info(info)
            warm_side.wait_for_spares(info)
    except BaseException:
        _stop_processes(info)
        raise
    for line in job_book.queue_again(Path(info.dir), JobServer(info.job_server, token)):
        say(line)
    return info, True


def _state(pid: int) -> str:
    return "running" if alive(pid) else "gone"


def _start_mlflow(service_dir: Path, info: ServiceInfo, env: dict[str, str],
                  token: str | None) -> int:
    store = service_dir / "mlflow"
    command = [sys.executable, "-m", "mlflow", "server",
               "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
               "--artifacts-destination", str(store / "artifacts"),
               "--host", info.host, "--port", str(info.mlflow_port), "--workers", "1"]
    env = {**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_USERNAME", None)
    env.pop("MLFLOW_TRACKING_PASSWORD", None)
    if token is not None:
        config = store / "auth.ini"
        config.write_text("[mlflow]\ndefault_permission = READ\n"
                          f"database_uri = sqlite:///{store / 'auth.db'}\n"
                          f"admin_username = {MLFLOW_USER}\n"
                          # MLflow 3.9 (the declared floor) reads the admin's password
                          # from here only; newer ones also from the environment below.
                          f"admin_password = {token}\n"
                          "authorization_function = "
                          "mlflow.server.auth:authenticate_request_basic_auth\n")
        os.chmod(config, 0o600)
        command += ["--app-name", "basic-auth"]
        env.update(MLFLOW_AUTH_CONFIG_PATH=str(config), MLFLOW_AUTH_ADMIN_PASSWORD=token,
                   MLFLOW_FLASK_SERVER_SECRET_KEY=hashlib.sha256(token.encode()).hexdigest())
    log = open(service_dir / "logs" / "mlflow.log", "ab")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    return process.pid


def _start_ray(service_dir: Path, info: ServiceInfo, env: dict[str, str],
               num_cpus: int | None, turns: int) -> int:
    node_ip = "127.0.0.1" if info.host in LOOPBACK else info.advertised_host
    command = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
               "--port", str(info.ray_port), "--node-ip-address", node_ip,
               "--include-dashboard=true", "--dashboard-host", info.host,
               "--dashboard-port", str(info.dashboard_port),
               # Ports with fixed defaults, chosen free so that the service never collides with
               # another Ray on the same machine.
               "--ray-client-server-port", str(free_port()),
               "--dashboard-agent-listen-port", str(free_port()),
               "--temp-dir", info.ray_temp_dir, "--disable-usage-stats",
               # The job turns: a job asks for one, so that Ray's job server queues the
               # rest, PENDING, without a process (tuner.service.job_book).
               "--resources", json.dumps({job_book.TURN: turns})]
    if num_cpus:
        command += ["--num-cpus", str(num_cpus)]
    log = open(service_dir / "logs" / "ray.log", "ab")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    return process.pid


def _wait_until_up(info: ServiceInfo, token: str | None) -> None:
    import urllib.request

    deadline = time.monotonic() + _START_TIMEOUT_S
    pending = {"Ray job server": f"http://127.0.0.1:{info.dashboard_port}/api/version"
               if info.host in ("0.0.0.0", "::") else f"{info.job_server}/api/version",
               "MLflow server": f"http://127.0.0.1:{info.mlflow_port}/health"
               if info.host in ("0.0.0.0", "::") else f"{info.tracking_uri}/health"}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    while pending:
        for name, url in list(pending.items()):
            try:
                request = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        del pending[name]
            except OSError:
                pass
        for name, pid in (("Ray head", info.ray_pid), ("MLflow server", info.mlflow_pid)):
            if not alive(pid):
                raise TunerError(f"the {name} exited during start-up; see "
                                 f"{Path(info.dir) / 'logs'}/")
        if pending and time.monotonic() > deadline:
            raise TunerError(f"{', '.join(pending)} did not answer within "
                             f"{_START_TIMEOUT_S:.0f} s; see {Path(info.dir) / 'logs'}/")
        if pending:
            time.sleep(0.3)


def _register(info: ServiceInfo, token: str | None) -> None:
    """Describe the service in Ray's own job store: a finished job whose metadata holds the
    MLflow address and the service directory, so any client that can reach the job server
    finds the rest (``tuner.service.client.service_record``)."""
    client = client_for(info.job_server, token)
    client.submit_job(entrypoint="echo precision-tuner service record",
                      submission_id=RECORD_JOB, metadata=info.record(),
                      entrypoint_num_cpus=0)


def pool_status(info: ServiceInfo) -> list[str]:
    """``service status``'s lines on the warm workers: busy, lent, idle per node."""
    if info.warm_workers == 0:
        return describe_pool(None)
    token = token_path(Path(info.dir)).read_text().strip() if info.auth else None
    try:
        return describe_pool(warm_side.pool_command(
            info, _environment(Path(info.dir), info, token), "status"))
    except (TunerError, subprocess.TimeoutExpired, ValueError) as exc:
        return [f"  warm workers: cannot ask the pool ({first_line(exc, 120)})"]


def stop(service_dir: Path) -> ServiceInfo | None:
    """Stop the service's processes. The running jobs are stopped first (each closes its
    records, resumable); a job whose turn comes meanwhile does not start. Both kinds, and
    those still queued, stay unfinished in the service's book: the next ``service start``
    queues them again (tuner.service.job_book)."""
    info = read_info(service_dir.resolve())
    if info is None:
        return None
    if running(info):
        draining = Path(info.dir) / job_book.DRAINING
        draining.touch()
        try:
            _stop_jobs(info)
        finally:
            _stop_processes(info)
            draining.unlink(missing_ok=True)
    else:
        _stop_processes(info)
    info.ray_pid = info.mlflow_pid = info.drivers_pid = 0
    write_info(info)
    return info


def _stop_jobs(info: ServiceInfo, wait_s: float = 90.0) -> list[str]:
    """Stop the running tuning jobs through Ray first, so each closes its records as on
    Ctrl-C (and can be resumed) instead of dying with the cluster. The queued ones are left
    to end with the cluster: Ray would only stop one once its turn came."""
    try:
        token = token_path(Path(info.dir)).read_text().strip() if info.auth else None
        client = client_for(info.job_server, token)
        deadline = time.monotonic() + wait_s
        stopping: set[str] = set()
        while time.monotonic() < deadline:
            running_jobs = [j.submission_id for j in client.list_jobs()
                            if (j.metadata or {}).get("precision_tuner") == JOB_KIND
                            and j.status.value == "RUNNING"]
            if not running_jobs:
                return []
            for job in set(running_jobs) - stopping:   # one that started meanwhile too
                client.stop_job(job)
                stopping.add(job)
            time.sleep(0.5)
        return running_jobs
    except Exception:  # noqa: BLE001 - stopping the service must not depend on its job server
        return []


def _stop_processes(info: ServiceInfo) -> None:
    """End each process group the service started: SIGTERM, then SIGKILL after a grace."""
    groups = [pid for pid in (info.drivers_pid, info.mlflow_pid, info.ray_pid) if pid > 0]
    for pid in groups:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5  # Ray's GCS and raylet may ignore SIGTERM
    while time.monotonic() < deadline and any(_group_alive(pid) for pid in groups):
        time.sleep(0.3)
    for pid in groups:
        if _group_alive(pid):
            _signal_group(pid, signal.SIGKILL)
    for pid in groups:  # reap our direct children when this process started them
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def describe(info: ServiceInfo, token_file: Path | None) -> list[str]:
    """How to reach the service and submit to it."""
    lines = [f"  Ray job server (jobs, dashboard): {info.job_server}",
             f"  Ray cluster (add nodes with `ray start --address {info.ray_address}`): "
             f"{info.ray_address}",
             f"  MLflow tracking server and UI: {info.tracking_uri}",
             f"  directory: {info.dir}",
             "submit a job:",
             f"  export PRECISION_TUNER_SERVICE={info.job_server}"]
    if token_file is not None:
        lines += ["  authentication is on: give the team the token file (readable by you only)",
                  f"  export PRECISION_TUNER_TOKEN=$(cat {token_file})"]
    lines.append("  precision-tuner submit my_task.py --trials 12   # then: precision-tuner jobs")
    return lines
