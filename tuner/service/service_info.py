"""The service's record and its host's facts (tuner.service.server starts and stops what it
describes): ``ServiceInfo`` (what ``DIR/service.json`` holds: addresses, ports, process ids, no
secrets), reading and writing it, whether its processes are alive, the shared token's file, and
the checks made before anything starts: addresses and ports, and that the installed Ray can
lock the service's door (token authentication, Ray 2.52 and newer)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.errors import UsageError
from tuner.records.run_store import write_atomic

RAY_TOKEN_AUTH = "2.52"   # the first Ray with token authentication (RAY_AUTH_MODE=token)
SERVICE_FILE = "service.json"
TOKEN_FILE = "auth_token"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServiceInfo:
    """What ``service.json`` holds: plain data, no secrets."""

    dir: str
    host: str
    ray_port: int
    dashboard_port: int
    mlflow_port: int
    auth: bool
    ray_temp_dir: str
    ray_pid: int = 0
    mlflow_pid: int = 0
    started_at: str = ""
    warm_workers: int | None = None      # slot workers per node (None: one per CPU; 0: no pool)
    pool: dict | None = None             # the pool as it stood when the service started
    drivers_pid: int = 0                 # the spare drivers' keeper (tuner.cli.spare)
    limits: dict | None = None           # what it admits (tuner.service.limits.ServiceLimits)

    @property
    def advertised_host(self) -> str:
        """The host clients use: the bind address, or this machine's address for 0.0.0.0."""
        if self.host in ("0.0.0.0", "::", ""):
            return primary_address()
        return self.host

    @property
    def job_server(self) -> str:
        return f"http://{self.advertised_host}:{self.dashboard_port}"

    @property
    def tracking_uri(self) -> str:
        return f"http://{self.advertised_host}:{self.mlflow_port}"

    @property
    def ray_address(self) -> str:
        return f"{self.advertised_host}:{self.ray_port}"

    def record(self) -> dict[str, str]:
        """The metadata of the service's record job: what a client needs to know."""
        return {"precision_tuner": "service", "tracking_uri": self.tracking_uri,
                "service_dir": self.dir, "auth": "token" if self.auth else "none",
                "ray_address": self.ray_address,
                "warm_workers": "per CPU" if self.warm_workers is None
                else str(self.warm_workers), **(self.limits or {})}


def primary_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing address
            return sock.getsockname()[0]
        except OSError:
            return socket.gethostname()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1" if host in ("0.0.0.0", "") else host, port)) == 0


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def read_info(service_dir: Path) -> ServiceInfo | None:
    path = service_dir / SERVICE_FILE
    if not path.is_file():
        return None
    try:
        return ServiceInfo(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}. Remove it and run `precision-tuner "
                         "service start` again.") from None


def write_info(info: ServiceInfo) -> None:
    write_atomic(Path(info.dir) / SERVICE_FILE, json.dumps(asdict(info), indent=2) + "\n")


def running(info: ServiceInfo | None) -> bool:
    return info is not None and alive(info.ray_pid) and alive(info.mlflow_pid)


def token_path(service_dir: Path) -> Path:
    return service_dir / TOKEN_FILE


def ensure_token(service_dir: Path) -> str:
    """The shared secret, created once, readable by its owner only."""
    path = token_path(service_dir)
    if not path.is_file():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return path.read_text().strip()


def ray_temp_dir(service_dir: Path) -> str:
    # Ray's unix sockets live under its temp dir, whose path must stay short.
    digest = hashlib.sha1(str(service_dir).encode()).hexdigest()[:10]
    return str(Path(tempfile.gettempdir()) / f"pt-ray-{digest}")


# Ray's default --min-worker-port and --max-worker-port: the head reserves them for its workers,
# and a head whose own port lies among them exits at start with only a pointer to its log.
RAY_WORKER_PORTS = (10002, 19999)


def check_ports(host: str, ports: dict[str, int]) -> None:
    """Refuse, in one line and before anything starts, a port that cannot work: not a port,
    privileged without root, the Ray head's inside Ray's worker-port range, two services on
    one port, or one already in use."""
    low, high = RAY_WORKER_PORTS
    seen: dict[int, str] = {}
    for name, port in ports.items():
        if port > 65535:
            raise UsageError(f"{name} {port} is not a port (at most 65535). Pass a port from "
                             "1024 to 65535.")
        if port < 1024 and os.geteuid() != 0:
            raise UsageError(f"{name} {port} is a privileged port (below 1024), which only "
                             "root may bind. Pass a port from 1024 to 65535.")
        if name == "--ray-port" and low <= port <= high:
            raise UsageError(f"{name} {port} lies in Ray's worker-port range ({low}-{high}), "
                             "which the head reserves for its workers, so it would exit at "
                             "start. Pass a port outside it, e.g. 6379 (the default).")
        if port in seen:
            raise UsageError(f"{seen[port]} and {name} are both {port}; each service needs "
                             "its own port. Pass another one for either.")
        seen[port] = name
    for name, port in ports.items():
        if port_in_use(host, port):
            raise UsageError(f"port {port} ({name}) on {host} is already in use. Pass another "
                             f"{name}, or stop what listens there.")


def check_ray_has_token_auth(host: str) -> None:
    """Refuse authentication the installed Ray cannot give: its token authentication
    (``RAY_AUTH_MODE=token``) came in Ray 2.52; an older Ray ignores the setting and its job
    server runs anyone's code."""
    from importlib.metadata import version

    from packaging.version import Version

    installed = version("ray")
    if Version(installed) < Version(RAY_TOKEN_AUTH):
        where = f"--host {host}" if host not in LOOPBACK else "--auth"
        raise UsageError(
            f"{where} needs token authentication, which Ray {installed} does not have (it "
            f"came in Ray {RAY_TOKEN_AUTH}): its job server would run anyone's code. Upgrade "
            f"Ray (pip install 'ray[default]>={RAY_TOKEN_AUTH}'), or bind to 127.0.0.1 and "
            "reach the service through an SSH tunnel.")
