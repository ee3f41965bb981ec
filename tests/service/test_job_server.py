"""The submit path's REST clients against stand-in HTTP servers that answer as the real ones do
(their routes and status codes): tuner.service.job_server (Ray's job server: the job posted
with its environment and one job turn, the jobs listed, refusals and an unreachable server as
one-line errors) and tuner.service.intake (MLflow's artifact proxy: a job's files streamed to
the service's book, a folder listed, the service's credentials sent). The real servers are
exercised by tests/service (every submit there goes through these clients)."""

from __future__ import annotations

import base64
import http.server
import json
import socket
import threading
import urllib.parse

import pytest

from tuner.errors import TunerError, UsageError
from tuner.service import job_book
from tuner.service.client import entrypoint, job_request
from tuner.service.intake import Intake
from tuner.service.job_server import JobServer

ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"


class _RaySide(http.server.BaseHTTPRequestHandler):
    """Ray's routes: POST /api/jobs/, GET /api/jobs/ID, GET /api/jobs/; and MLflow's
    artifact proxy: PUT /api/2.0/mlflow-artifacts/artifacts/PATH, GET ...artifacts?path=."""

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
        if self.path.startswith(ARTIFACTS + "?"):
            folder = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["path"][0]
            files = [{"path": name.rsplit("/", 1)[1], "is_dir": False}
                     for name in state["artifacts"] if name.rsplit("/", 1)[0] == folder]
            return self._answer(200, json.dumps({"files": files} if files else {}).encode())
        if self.path == "/api/jobs/":
            return self._answer(200, json.dumps(list(state["jobs"].values())).encode())
        job = state["jobs"].get(self.path.rsplit("/", 1)[1])
        self._answer(200, json.dumps(job).encode()) if job else self._answer(404, b"no job")

    def do_PUT(self):
        body = self._body()
        if self._seen():
            path = urllib.parse.unquote(self.path[len(ARTIFACTS) + 1:])
            self.server.state["artifacts"][path] = body
            self._answer(200, b"{}")

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
    server.state = {"requests": [], "artifacts": {}, "jobs": {}, "token": None}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _address(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _request(job_id: str) -> dict:
    command = entrypoint(task_name="t.py", run_root=f"/srv/svc/jobs/{job_id}",
                         tracking_uri="http://h:5000", tune_args=["--trials", "4"])
    return job_request(job_id=job_id, entrypoint_command=command,
                       metadata={"precision_tuner": "job"},
                       env_vars={"PYTHONUNBUFFERED": "1",
                                 job_book.JOB_ROOT_ENV: f"/srv/svc/jobs/{job_id}"})


def _submit(client: JobServer, job_id: str) -> str:
    return client.submit(_request(job_id))


def test_a_job_asks_for_one_turn_and_goes_without_files(ray_side):
    client = JobServer(_address(ray_side), None)
    assert _submit(client, "job-1") == "job-1"
    job = ray_side.state["jobs"]["job-1"]
    # one of the head's job turns: beyond them Ray keeps the job PENDING, with no process
    assert job["entrypoint_resources"] == {job_book.TURN: 1}
    # no working_dir package: the files went to the service's book (MLflow) beforehand
    assert job["runtime_env"] == {"env_vars": {"PYTHONUNBUFFERED": "1",
                                               job_book.JOB_ROOT_ENV: "/srv/svc/jobs/job-1"}}
    assert job["entrypoint"].startswith("exec python -m tuner.cli.handoff tune "
                                        "/srv/svc/jobs/job-1/task/t.py --trials 4 "
                                        "--run-dir /srv/svc/jobs/job-1/run --ray-address auto")
    assert "--resume" not in job["entrypoint"]   # the handoff decides, from the run's record
    assert client.job("job-1")["status"] == "PENDING"
    assert client.job("no-such-job") is None
    assert [j["submission_id"] for j in client.jobs()] == ["job-1"]


def test_a_jobs_files_stream_to_the_book_with_the_services_credentials(ray_side, tmp_path):
    data = tmp_path / "t.data.pkl"
    data.write_bytes(bytes(range(256)) * 4096)       # 1 MiB
    intake = Intake(_address(ray_side), "s3cret")
    intake.put_file(job_book.artifact_path("job 1", data.name), data)
    intake.put_text(job_book.artifact_path("job 1", job_book.SUBMISSION), "{}\n")
    assert ray_side.state["artifacts"]["queue/job 1/t.data.pkl"] == data.read_bytes()
    assert intake.names("queue/job 1") == {"t.data.pkl", "job.json"}
    assert intake.names("queue/job-2") == set()
    basic = base64.b64encode(b"precision-tuner:s3cret").decode()
    assert {auth for _, _, auth in ray_side.state["requests"]} == {f"Basic {basic}"}


def test_a_refused_artifact_request_names_the_token(ray_side):
    ray_side.state["token"] = "s3cret"
    with pytest.raises(UsageError) as refused:
        Intake(_address(ray_side), None).names("queue/job-1")
    message = str(refused.value)
    assert "refused the request (HTTP 401)" in message and "PRECISION_TUNER_TOKEN" in message
    assert "\n" not in message


def test_a_refusal_is_one_line_with_the_server_s_reason(ray_side):
    client = JobServer(_address(ray_side), None)
    _submit(client, "job-1")
    with pytest.raises(TunerError) as refused:
        _submit(client, "job-1")
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
