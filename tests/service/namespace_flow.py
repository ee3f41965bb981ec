"""Run inside a network namespace whose only addresses are its loopback and HOST (set up by
tests/service/test_beyond_loopback.py): start the service bound to HOST, which turns
authentication on, then use it as a teammate would and print what was observed, one JSON
object on the last line."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _listening(host: str, port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


def main(host: str, folder: str) -> None:
    seen: dict = {}
    started = cli("service", "start", "--dir", folder, "--host", host, "--num-cpus", "2",
                  timeout=240)
    seen["start"] = [started.returncode, started.stdout[-3000:] + started.stderr[-3000:]]
    if started.returncode != 0:
        seen["listening"] = [port for port in (8265, 5000, 6379) if _listening(host, port)]
        print(json.dumps(seen))
        return
    try:
        address = f"http://{host}:8265"
        token_file = Path(folder) / "auth_token"
        env = {"PRECISION_TUNER_SERVICE": address}
        refused = cli("jobs", env=env)
        seen["jobs_without_token"] = [refused.returncode, refused.stderr.strip()]
        try:
            urllib.request.urlopen(f"http://{host}:5000/api/2.0/mlflow/experiments/search"
                                   "?max_results=1", timeout=10)
            seen["mlflow_without_token"] = 200
        except urllib.error.HTTPError as exc:
            seen["mlflow_without_token"] = exc.code
        request = urllib.request.Request(
            f"{address}/api/jobs/", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"entrypoint": f"touch {folder}/ran"}).encode())
        try:   # a raw request to Ray's Jobs API, as anyone on the network could send it
            urllib.request.urlopen(request, timeout=10)
            seen["jobs_api_without_token"] = 200
        except urllib.error.HTTPError as exc:
            seen["jobs_api_without_token"] = exc.code
        env["PRECISION_TUNER_TOKEN"] = token_file.read_text().strip()
        submitted = cli("submit", str(ROOT / "tests" / "fixtures" / "tasks" / "tiny_mlp.py"),
                        "--trials", "3", "--steps", "10", env=env)
        seen["submit"] = [submitted.returncode, submitted.stderr[-2000:]]
        job = submitted.stdout.strip().splitlines()[-1] if submitted.returncode == 0 else None
        deadline = time.monotonic() + 400
        while job and time.monotonic() < deadline:
            status = cli("status", job, env=env)
            seen["status"] = status.stdout
            if any(f"job {job}: {end}" in status.stdout
                   for end in ("SUCCEEDED", "FAILED", "STOPPED")):
                break
            time.sleep(2)
        if job:
            out = Path(folder) / "fetched.json"
            fetched = cli("fetch", job, "--out", str(out), env=env)
            seen["fetch"] = [fetched.returncode, fetched.stderr[-2000:]]
            seen["fetched"] = json.loads(out.read_text()) if out.exists() else None
    finally:
        stopped = cli("service", "stop", "--dir", folder, timeout=120)
        seen["stop"] = stopped.returncode
        seen["anyone_ran"] = (Path(folder) / "ran").exists()
        print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
