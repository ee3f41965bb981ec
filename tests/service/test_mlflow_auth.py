"""The service's MLflow server with authentication, started as ``service start`` starts it,
at whatever MLflow is installed: ``make test`` runs it at the newest, ``make test-lowest`` at the
declared floor (MLflow 3.9 read the admin's password from auth.ini only, and exited at start-up
without it). A request without the token is refused, with it answered; the service's book
(tuner.service.intake) writes through it with the token only."""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.service import job_book, server
from tuner.service.intake import Intake
from tuner.service.service_info import ServiceInfo, ensure_token

pytestmark = pytest.mark.system


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _code(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:            # not listening yet
        return 0


def test_the_mlflow_server_starts_with_authentication_and_refuses_without_the_token(tmp_path):
    service_dir = tmp_path / "svc"
    for sub in ("logs", "mlflow"):
        (service_dir / sub).mkdir(parents=True)
    port = _free_port()
    info = ServiceInfo(dir=str(service_dir), host="127.0.0.1", ray_port=0, dashboard_port=0,
                       mlflow_port=port, auth=True, ray_temp_dir=str(tmp_path / "ray"))
    token = ensure_token(service_dir)
    env = server._environment(service_dir, info, token)
    pid = server._start_mlflow(service_dir, info, env, token)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while _code(f"{base}/health") != 200:
            log = (service_dir / "logs" / "mlflow.log").read_text(errors="replace")
            assert server.alive(pid), f"the MLflow server exited at start-up:\n{log[-3000:]}"
            assert time.monotonic() < deadline, log[-3000:]
            time.sleep(0.5)
        search = f"{base}/api/2.0/mlflow/experiments/search?max_results=1"
        assert _code(search) == 401
        import base64

        pair = base64.b64encode(f"precision-tuner:{token}".encode()).decode()
        assert _code(search, {"Authorization": f"Basic {pair}"}) == 200
        wrong = base64.b64encode(b"precision-tuner:guess").decode()
        assert _code(search, {"Authorization": f"Basic {wrong}"}) == 401

        task = tmp_path / "t.py"
        task.write_text("LOSS = 'mse'\n")
        with pytest.raises(UsageError):
            Intake(base, None).put_file(job_book.artifact_path("job-1", "t.py"), task)
        Intake(base, token).put_file(job_book.artifact_path("job-1", "t.py"), task)
        landed = job_book.intake_root(service_dir) / "job-1" / "t.py"
        assert landed.read_text() == "LOSS = 'mse'\n"
        assert Intake(base, token).names("queue/job-1") == {"t.py"}
        assert oct(os.stat(Path(service_dir) / "mlflow" / "auth.ini").st_mode)[-3:] == "600"
    finally:
        server._signal_group(pid, 15)
        deadline = time.monotonic() + 10
        while server.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        server._signal_group(pid, 9)
