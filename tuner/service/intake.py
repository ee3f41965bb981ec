"""A job's files into the service's book (tuner.service.job_book), through MLflow's artifact
proxy: the service's own MLflow server writes them under its artifact root on the head's disk.

``submit`` sends the task (and its data and space file) and the submission here before it
sends the job to Ray, so a queued job is on the service's disk, not only in the Ray head's
memory, and a job's size is bounded by the service's limit, not by the 100 MiB a request to
Ray's dashboard may have. ``stop`` leaves a job's ``stop_requested`` here.

MLflow's documented artifact routes, with the service's credentials where it requires them:

- ``PUT /api/2.0/mlflow-artifacts/artifacts/PATH``: a file, streamed from disk;
- ``GET /api/2.0/mlflow-artifacts/artifacts?path=FOLDER``: a folder's files.

Plain stdlib (urllib), like tuner.service.job_server: this is on the submit path.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tuner.errors import TunerError, UsageError, first_line
from tuner.service.contract import MLFLOW_USER

_ROUTE = "/api/2.0/mlflow-artifacts/artifacts"
_TIMEOUT_S = 300.0


class Intake:
    """The artifact proxy of the MLflow server at ``tracking_uri``."""

    def __init__(self, tracking_uri: str, token: str | None) -> None:
        self.base = tracking_uri.rstrip("/")
        self.token = token

    def _request(self, method: str, url: str, body=None, length: int | None = None) -> bytes:
        request = urllib.request.Request(url, data=body, method=method)
        if self.token:
            pair = base64.b64encode(f"{MLFLOW_USER}:{self.token}".encode()).decode()
            request.add_header("Authorization", f"Basic {pair}")
        if length is not None:
            request.add_header("Content-Length", str(length))
            request.add_header("Content-Type", "application/octet-stream")
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            if error.code in (401, 403):
                raise UsageError(f"the service's MLflow server at {self.base} refused the "
                                 f"request (HTTP {error.code}). Set PRECISION_TUNER_TOKEN to "
                                 "the service's token, or pass --token-file DIR/auth_token") \
                    from None
            raise TunerError(f"the service's MLflow server at {self.base} answered HTTP "
                             f"{error.code} to {method} {urllib.parse.urlsplit(url).path}: "
                             f"{first_line(Exception(error.read().decode(errors='replace')))}"
                             ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise UsageError(f"cannot reach the service's MLflow server at {self.base}: "
                             f"{first_line(exc)}. Check that the service is up "
                             "(`precision-tuner service status`).") from None

    def put_file(self, path: str, source: Path) -> None:
        """``source`` (a file) to ``path``, streamed: a large data file is never held in
        memory."""
        size = source.stat().st_size
        with open(source, "rb") as handle:
            self._request("PUT", f"{self.base}{_ROUTE}/{urllib.parse.quote(path)}", handle,
                          size)

    def put_text(self, path: str, text: str) -> None:
        body = text.encode()
        self._request("PUT", f"{self.base}{_ROUTE}/{urllib.parse.quote(path)}", body,
                      len(body))

    def names(self, folder: str) -> set[str]:
        """The file names in ``folder`` (empty where it does not exist)."""
        query = urllib.parse.urlencode({"path": folder})
        answer = json.loads(self._request("GET", f"{self.base}{_ROUTE}?{query}") or b"{}")
        return {entry["path"].rsplit("/", 1)[-1] for entry in answer.get("files", [])}
