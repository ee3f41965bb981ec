"""tuner.service.job_server, the submit path's REST client of Ray's job server, against a
stand-in HTTP server that answers as Ray's does (its routes and status codes): the job's
files uploaded once as a content-named zip, after the pin request; the job posted with its
runtime environment; refusals and an unreachable server as one-line errors. The real job
server is exercised by tests/service (every submit there goes through this client)."""

from __future__ import annotations

import http.server
import io
import json
import socket
import threading
import zipfile

import pytest

from tuner.errors import TunerError, UsageError
from tuner.service.job_server import JobServer


class _RaySide(http.server.BaseHTTPRequestHandler):
    """Ray's routes: GET/PUT /api/packages/gcs/NAME, POST /api/jobs/, GET /api/jobs/ID."""

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _seen(self, body: bytes = b"") -> bool:
        state = self.server.state
        state["requests"].append((self.command, self.path, self.headers.get("Authorization")))
        if state["token"] and self.headers.get("Authorization") != f"Bearer {state['token']}":
            self._answer(401, b"Unauthorized: missing or invalid token")
            return False
        return True

    def do_GET(self):
        if not self._seen():
            return
        state = self.server.state
        if self.path.startswith("/api/packages/gcs/"):
            return self._answer(200 if self.path.rsplit("/", 1)[1] in state["packages"] else 404)
        job = state["jobs"].get(self.path.rsplit("/", 1)[1])
        self._answer(200, json.dumps(job).encode()) if job else self._answer(404, b"no job")

    def do_PUT(self):
        body = self._body()
        if self._seen():
            self.server.state["packages"][self.path.rsplit("/", 1)[1]] = body
            self._answer(200)

    def do_POST(self):
        body = json.loads(self._body())
        if not self._seen():
            return
        jobs = self.server.state["jobs"]
        if body["submission_id"] in jobs:
            return self._answer(500, b"Traceback (most recent call last):\n  File ...\n"
                                     b"ValueError: Job with submission_id "
                                     + body["submission_id"].encode() + b" already exists.\n.")
        jobs[body["submission_id"]] = {"status": "PENDING", **body}
        self._answer(200, json.dumps({"submission_id": body["submission_id"]}).encode())


@pytest.fixture
def ray_side():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RaySide)
    server.state = {"requests": [], "packages": {}, "jobs": {}, "token": None}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _address(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _submit(client: JobServer, job_id: str, files: dict[str, bytes]) -> str:
    return client.submit(entrypoint="exec python -m tuner.cli.handoff tune t.py",
                         submission_id=job_id, metadata={"precision_tuner": "job"},
                         env_vars={"PYTHONUNBUFFERED": "1"}, files=files)


def test_a_job_goes_with_its_files_as_a_content_named_zip_uploaded_once(ray_side):
    client = JobServer(_address(ray_side), None)
    files = {"t.py": b"def build_model(): ...\n", "space.yaml": b"policies: [float32]\n"}
    assert _submit(client, "job-1", files) == "job-1"
    assert _submit(client, "job-2", files) == "job-2"
    (name, package), = ray_side.state["packages"].items()
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        assert {n: archive.read(n) for n in archive.namelist()} == files
    assert name.startswith("_ray_pkg_") and name.endswith(".zip")
    requests = [(method, path) for method, path, _ in ray_side.state["requests"]]
    package_path = f"/api/packages/gcs/{name}"
    # first the pin (GET) and the upload, then the job; the second job finds the package
    assert requests == [("GET", package_path), ("PUT", package_path), ("POST", "/api/jobs/"),
                        ("GET", package_path), ("POST", "/api/jobs/")]
    job = ray_side.state["jobs"]["job-1"]
    assert job["runtime_env"] == {"working_dir": f"gcs://{name}",
                                  "env_vars": {"PYTHONUNBUFFERED": "1"}}
    assert job["metadata"] == {"precision_tuner": "job"}
    assert client.job("job-1")["status"] == "PENDING"
    assert client.job("no-such-job") is None


def test_a_refusal_is_one_line_with_the_server_s_reason(ray_side):
    client = JobServer(_address(ray_side), None)
    _submit(client, "job-1", {"t.py": b"x = 1\n"})
    with pytest.raises(TunerError) as refused:
        _submit(client, "job-1", {"t.py": b"x = 1\n"})
    message = str(refused.value)
    assert "\n" not in message and "refused job job-1 (HTTP 500: ValueError: Job with " \
        "submission_id job-1 already exists.)" in message


def test_the_token_is_sent_and_a_missing_one_is_a_usage_error(ray_side):
    ray_side.state["token"] = "s3cret"
    with pytest.raises(UsageError) as refused:
        JobServer(_address(ray_side), None).job("precision-tuner-service")
    assert "refused the request: it requires authentication" in str(refused.value)
    with pytest.raises(UsageError) as wrong:
        JobServer(_address(ray_side), "0" * 8).job("precision-tuner-service")
    assert "the token was not accepted" in str(wrong.value)
    assert JobServer(_address(ray_side), "s3cret").job("precision-tuner-service") is None
    assert ray_side.state["requests"][-1][2] == "Bearer s3cret"


def test_an_unreachable_server_is_a_usage_error_naming_the_address():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UsageError) as unreachable:
        JobServer(f"http://127.0.0.1:{port}", None).job("precision-tuner-service")
    message = str(unreachable.value)
    assert message.startswith(f"cannot reach the service at --service http://127.0.0.1:{port}: ")
    assert "\n" not in message and "Start it" in message
