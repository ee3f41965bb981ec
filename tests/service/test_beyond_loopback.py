"""The service bound beyond loopback, as a team runs it: in a network namespace this test
creates (``unshare --net``), whose addresses are its own loopback and 10.200.0.1, an address
that is not loopback. Bound there, the service turns authentication on: Ray's job server and
MLflow refuse requests without the token, and with it a job is submitted, finishes, and its
config is fetched. At a Ray without token authentication (before 2.52: ``make test-lowest``
runs this at the declared floor, 2.40) the start is refused instead, naming the Ray version,
and nothing listens. Skipped where the machine does not allow a network namespace (a failure
under ``PT_REQUIRE_FAULTS=1``)."""

import json
import subprocess
import sys
from importlib.metadata import version

import pytest

from tests.conftest import ROOT, not_injectable

pytestmark = pytest.mark.system
HOST = "10.200.0.1"
SETUP = f"ip link set lo up && ip addr add {HOST}/32 dev lo"


def _namespaces_allowed() -> bool:
    try:
        return subprocess.run(["unshare", "--net", "sh", "-c", SETUP], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_bound_to_a_non_loopback_address_it_requires_the_token_and_runs_a_job(tmp_path):
    if not _namespaces_allowed():
        not_injectable("no network namespace here (unshare --net needs root)")
    flow = ROOT / "tests" / "service" / "namespace_flow.py"
    done = subprocess.run(["unshare", "--net", "sh", "-c",
                           f'{SETUP} && exec "$0" "$1" "$2" "$3"', sys.executable, str(flow),
                           HOST, str(tmp_path / "svc")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    code, output = seen["start"]
    from packaging.version import Version

    if Version(version("ray")) < Version("2.52"):
        assert code == 2, output
        assert f"--host {HOST} needs token authentication, which Ray {version('ray')} does " \
            "not have (it came in Ray 2.52)" in output
        assert seen["listening"] == [], seen
        return
    assert code == 0, output
    assert f"Ray job server (jobs, dashboard): http://{HOST}:8265" in output
    assert "authentication is on" in output
    code, message = seen["jobs_without_token"]
    assert code == 2 and "requires authentication" in message, message
    assert seen["mlflow_without_token"] == 401
    assert seen["jobs_api_without_token"] in (401, 403) and not seen["anyone_ran"], seen
    assert seen["submit"][0] == 0, seen["submit"][1]
    assert ": SUCCEEDED" in seen["status"], seen["status"]
    assert seen["fetch"][0] == 0, seen["fetch"][1]
    assert seen["fetched"]["policy"] in ("float32", "mixed_bfloat16", "mixed_float16")
    assert seen["stop"] == 0
