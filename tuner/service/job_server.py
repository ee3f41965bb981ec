"""Ray's job server over its REST API, for the requests on ``submit``'s path: the service's
record, the jobs it holds (a submitter's queued ones are counted against the service's limit)
and the job itself (its files go to the service's book first: tuner.service.intake).

Ray's own client (``ray.job_submission``, tuner.service.contract.client_for) sends the same
requests, but importing it took 0.75 s of a 1.2 s ``precision-tuner submit`` on this project's
2-core EPYC, and a submission is what a user waits on. The other commands, which wait on
logs or the cluster anyway, keep Ray's client.

The requests are those of Ray's documented Jobs REST API, as Ray's client sends them:

- ``GET /api/jobs/ID``: a job's details (404: no such job);
- ``GET /api/jobs/``: every job's details;
- ``POST /api/jobs/`` with the entrypoint, submission id, metadata, runtime environment (its
  environment variables) and entrypoint resources (one of the head's job turns).

Plain stdlib (urllib): nothing here may cost an import on the submit path.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tuner.errors import TunerError, UsageError, first_line
from tuner.service.contract import refused_message, unreachable_message

_TIMEOUT_S = 30.0


class JobServer:
    """The Ray job server at ``address`` (``http://HOST:PORT``), with ``token`` (the service's
    bearer token) when it asks for one."""

    def __init__(self, address: str, token: str | None) -> None:
        self.address = address
        self.token = token

    def _request(self, method: str, path: str, body: bytes | None = None,
                 content_type: str | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.address + path, data=body, method=method)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        if content_type:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            text = error.read()
            if error.code in (401, 403):
                raise UsageError(refused_message(self.address, _last_line(text) or
                                                 f"HTTP {error.code}", self.token)) from None
            return error.code, text
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UsageError(unreachable_message(self.address, first_line(
                reason if isinstance(reason, BaseException) else exc))) from None

    def job(self, job_id: str) -> dict | None:
        """The job's details (``status``, ``metadata``, ...), or None when there is none."""
        status, body = self._request("GET", f"/api/jobs/{job_id}")
        if status == 404:
            return None
        if status != 200:
            raise TunerError(f"the job server at {self.address} answered HTTP {status} for "
                             f"job {job_id!r}: {_last_line(body)}")
        return json.loads(body)

    def jobs(self) -> list[dict]:
        """Every job the server knows, each as its details (``status``, ``metadata``, ...)."""
        status, body = self._request("GET", "/api/jobs/")
        if status != 200:
            raise TunerError(f"the job server at {self.address} answered HTTP {status} to the "
                             f"list of jobs: {_last_line(body)}")
        return json.loads(body)

    def submit(self, request: dict) -> str:
        """Post a job (``request``: Ray's submit request, tuner.service.client.job_request)."""
        status, body = self._request("POST", "/api/jobs/", json.dumps(request).encode(),
                                     "application/json")
        if status != 200:
            raise TunerError(f"the job server at {self.address} refused job "
                             f"{request.get('submission_id')} (HTTP {status}: "
                             f"{_last_line(body)})")
        return json.loads(body)["submission_id"]


def _last_line(body: bytes) -> str:
    """A server error's last line (Ray answers with a traceback, its message last)."""
    lines = [line.strip() for line in body.decode(errors="replace").splitlines() if line.strip()
             and line.strip() != "."]
    return lines[-1][:300] if lines else ""
