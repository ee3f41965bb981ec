"""The service under a team's load: ``--jobs`` small jobs submitted at once (from ``--senders``
submitters side by side) to a loopback service that runs one job at a time (one warm worker).
Reports whether every job succeeded and its config could be fetched, how many ran at once at
most (sampled every second), the resident memory of the Ray head's processes (and of every
process of the service) idle and at its peak while the jobs queue, and the queue's overhead
per job: from one job's end (Ray's end time) to the next job's first trial opened in MLflow.

    python benchmarks/service_queue.py [TASK.py] [--jobs 50] [--trials 2] [--steps 10]
    # the service page's table (docs/how-to/service.md), from the results:
    python benchmarks/service_queue.py --table

Results go to benchmarks/results/service_queue.json; the service page's load table is
``--table``'s output (tests/judging/test_benchmark_results.py checks that they agree).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "service_queue.json"
MIB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def group_rss(pgids: set[int]) -> int:
    """Resident bytes of every live process whose process group is one of ``pgids``."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) in pgids:
                total += int((entry / "statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def table(results: dict) -> str:
    """The service page's load table (markdown) of ``results``."""
    overhead = results["queue_overhead_s"]
    rows = [
        ("jobs succeeded, configs fetched",
         f"{results['succeeded']} of {results['jobs']}, {results['fetched']} of "
         f"{results['jobs']}"),
        ("jobs running at once, most (sampled each second)",
         str(results["most_running_at_once"])),
        ("jobs queued at once, most", str(results["most_queued_at_once"])),
        ("the Ray head's resident memory, idle / at its peak while they queued",
         f"{results['head_rss_idle_mib']} / {results['head_rss_peak_mib']} MiB"),
        ("every service process's (head, MLflow, spare drivers), idle / peak",
         f"{results['service_rss_idle_mib']} / {results['service_rss_peak_mib']} MiB"),
        (f"the submit command, median / slowest ({results['senders']} at once)",
         f"{results['submit_s_median']:.1f} / {results['submit_s_max']:.1f} s"),
        ("the queue's overhead a job: one job's end to the next one's first trial, median "
         "(p90, max)", f"{overhead['median']:.1f} s ({overhead['p90']:.1f}, "
                       f"{overhead['max']:.1f})"),
        (f"all {results['jobs']}, wall", f"{results['wall_s']:.0f} s"),
    ]
    return "\n".join([f"| {results['task']} (`{results['flags']}`), {results['machine']} "
                      "| measured |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", default=str(ROOT / "tests" / "fixtures" / "tasks"
                                                      / "tiny_mlp.py"))
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--senders", type=int, default=10)
    parser.add_argument("--trials", default="2")
    parser.add_argument("--steps", default="10")
    parser.add_argument("--table", action="store_true",
                        help="print the service page's table from the results file and stop")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(RESULTS.read_text())))
        return

    folder = Path(tempfile.mkdtemp(prefix="pt-queue-"))
    service_dir = folder / "svc"
    ports = {"--ray-port": _free_port(), "--dashboard-port": _free_port(),
             "--mlflow-port": _free_port()}
    env = {**os.environ, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
           "PRECISION_TUNER_SERVICE": f"http://127.0.0.1:{ports['--dashboard-port']}"}
    start = ["service", "start", "--dir", str(service_dir), "--num-cpus", "2",
             "--warm-workers", "1", "--max-queued-per-user", str(args.jobs + 5)]
    for flag, port in ports.items():
        start += [flag, str(port)]
    started = cli(*start, env=env)
    if started.returncode != 0:
        raise SystemExit(started.stdout + started.stderr)
    from mlflow import MlflowClient
    from ray.job_submission import JobSubmissionClient

    info = json.loads((service_dir / "service.json").read_text())
    head, everything = {info["ray_pid"]}, {info["ray_pid"], info["mlflow_pid"],
                                            info["drivers_pid"]}
    jobs = JobSubmissionClient(env["PRECISION_TUNER_SERVICE"])
    mlflow = MlflowClient(f"http://127.0.0.1:{ports['--mlflow-port']}")
    try:
        time.sleep(5)
        idle_head = statistics.median(group_rss(head) for _ in range(5))
        idle_all = statistics.median(group_rss(everything) for _ in range(5))
        samples: list[tuple[float, int, int, int, int]] = []
        stop_sampling = threading.Event()

        def sample() -> None:
            while not stop_sampling.is_set():
                states = [j.status.value for j in jobs.list_jobs()
                          if (j.metadata or {}).get("precision_tuner") == "job"]
                samples.append((time.time(), states.count("RUNNING"), states.count("PENDING"),
                                group_rss(head), group_rss(everything)))
                stop_sampling.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        began = time.time()

        def submit(index: int) -> tuple[str | None, float, str]:
            sent = time.time()
            done = cli("submit", args.task, "--trials", args.trials, "--steps", args.steps,
                       env={**env, "USER": f"user{index % 3}", "LOGNAME": f"user{index % 3}"})
            job = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else None
            return job, time.time() - sent, done.stderr[-500:]

        with concurrent.futures.ThreadPoolExecutor(args.senders) as pool:
            submitted = list(pool.map(submit, range(args.jobs)))
        refused = [why for job, _, why in submitted if job is None]
        ids = [job for job, _, _ in submitted if job]
        while True:
            statuses = {job: jobs.get_job_status(job).value for job in ids}
            if all(s in ("SUCCEEDED", "FAILED", "STOPPED") for s in statuses.values()):
                break
            time.sleep(2)
        wall = time.time() - began
        stop_sampling.set()
        sampler.join()

        details = sorted((jobs.get_job_info(job) for job in ids),
                         key=lambda d: d.end_time or 0)
        experiments = [e.experiment_id for e in mlflow.search_experiments()]
        first_trial = {}
        for job in ids:
            runs = mlflow.search_runs(experiments, filter_string=(
                f"tags.`precision_tuner.job_id` = '{job}' and "
                "tags.`precision_tuner.kind` = 'trial'"),
                order_by=["attributes.start_time ASC"], max_results=1)
            first_trial[job] = runs[0].info.start_time / 1000 if runs else None
        gaps = [first_trial[after.submission_id] - before.end_time / 1000
                for before, after in zip(details, details[1:])
                if first_trial.get(after.submission_id) and before.end_time]
        fetched = 0
        for job in ids:
            out = folder / f"{job}.json"
            if cli("fetch", job, "--out", str(out), env=env).returncode == 0 and out.exists():
                fetched += 1
        results = {
            "machine": f"{os.cpu_count()} CPUs ({_cpu_model()})",
            "measured": time.strftime("%Y-%m-%d"),
            "task": Path(args.task).name, "flags": f"--trials {args.trials} --steps {args.steps}",
            "jobs": args.jobs, "senders": args.senders,
            "submitted": len(ids), "refused": refused,
            "succeeded": sum(s == "SUCCEEDED" for s in statuses.values()),
            "statuses": statuses, "fetched": fetched, "wall_s": round(wall, 1),
            "submit_s_median": round(statistics.median(s for _, s, _ in submitted), 2),
            "submit_s_max": round(max(s for _, s, _ in submitted), 2),
            "most_running_at_once": max(s[1] for s in samples),
            "most_queued_at_once": max(s[2] for s in samples),
            "head_rss_idle_mib": round(idle_head / MIB), "head_rss_peak_mib":
                round(max(s[3] for s in samples) / MIB),
            "service_rss_idle_mib": round(idle_all / MIB), "service_rss_peak_mib":
                round(max(s[4] for s in samples) / MIB),
            "queue_overhead_s": {"median": round(statistics.median(gaps), 2),
                                 "p90": round(sorted(gaps)[int(0.9 * (len(gaps) - 1))], 2),
                                 "max": round(max(gaps), 2), "n": len(gaps)} if gaps else None,
        }
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        shown = {k: v for k, v in results.items() if k != "statuses"}
        print(json.dumps(shown, indent=1))
    finally:
        cli("service", "stop", "--dir", str(service_dir), env=env)


if __name__ == "__main__":
    main()
