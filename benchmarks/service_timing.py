"""The tuning service's own figures, on this machine: start-up time, submit-to-first-trial
latency (and the part of it that is Ray's job server's own: a bare entrypoint's start), each
job's own start-up phase, and the wall time of two jobs submitted together against the same
two one after the other (``--pairs`` times, in turns, from a settled service); cold
(``service start --warm-workers 0``: each job starts its own TensorFlow workers) and warm
(the service's pool lends them). Starts a loopback service on free ports in a temporary
directory for each, and stops it.

    python benchmarks/service_timing.py [TASK.py] [--trials 4] [--steps 20] [--pairs 2]
    # the service page's table (docs/how-to/service.md), from the results:
    python benchmarks/service_timing.py --table

Results go to benchmarks/results/service_timing.json; the service page's table
(docs/how-to/service.md) is ``--table``'s output (tests/judging/test_benchmark_results.py checks
that they agree).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "service_timing.json"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"precision-tuner {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def table(results: dict) -> str:
    """The service page's table (docs/how-to/service.md) of ``results`` (markdown): cold
    (``--warm-workers 0``: every job starts its own TensorFlow workers) and warm (the service's
    pool lends them)."""
    cold, warm = results["cold"], results["warm"]
    machine = f"{results['cpus']} CPUs" + (f" ({results['cpu']})" if results.get("cpu") else "")
    lines = [f"| {results['task']} (`{results['flags']}`), {machine} | cold (s) "
             "| warm (s) | warm / cold |", "|---|---|---|---|"]
    for name, seconds in cold["figures"].items():
        lines.append(f"| {name} | {seconds:.1f} | {warm['figures'][name]:.1f} | "
                     f"{warm['figures'][name] / seconds:.2f} |")
    if "submit_to_first_trial_each" in warm:
        lines.append("| submit to first trial opened, each single job | "
                     + " | ".join(", ".join(f"{s:.1f}" for s in side.get(
                         "submit_to_first_trial_each", [])) for side in (cold, warm))
                     + " | |")
    lines.append("| two jobs: together / one after the other, median (each) | "
                 + " | ".join(_ratios(side) for side in (cold, warm)) + " | (ratios) |")
    return "\n".join(lines)


def _ratios(side: dict) -> str:
    each = side.get("together_over_sequential_each", [])
    return f"{side['together_over_sequential']:.2f}" + (
        f" ({', '.join(f'{r:.2f}' for r in each)})" if len(each) > 1 else "")


def _cpu_model() -> str:
    """The CPU's model name (Linux), so that figures from different machines are told apart."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _timing(service_dir: Path, job: str) -> dict:
    """The job's own clock (its timing.json), which starts when its `tune` process does."""
    return json.loads((service_dir / "jobs" / job / "run" / "timing.json").read_text())


def _start_up_phase(service_dir: Path, job: str) -> float:
    """The job's own start-up phase: the command, Ray, the worker."""
    return _timing(service_dir, job)["phases"]["start-up"]


def ray_floor(jobs, folder: Path, wait) -> float:
    """Seconds from submitting a Ray job whose entrypoint only writes the time to that
    entrypoint's start: the latency of Ray's job server itself (its job supervisor actor and
    the entrypoint's shell), which every submitted job pays before precision-tuner runs."""
    stamp = folder / "entrypoint_started"
    stamp.unlink(missing_ok=True)
    began = time.time()
    wait(jobs.submit_job(entrypoint=f"date +%s.%N > {stamp}"))
    return float(stamp.read_text()) - began


def scenario(task: str, trials: str, steps: str, warm: bool, repeats: int,
             singles_count: int = 3) -> dict:
    """One service, started, used and stopped: its figures in seconds. ``singles_count``
    single jobs, each from a settled service, give the one-job figures (their medians: Ray's
    floor alone moved 1.35-2.07 s between runs on one idle machine)."""
    folder = Path(tempfile.mkdtemp(prefix="pt-service-timing-"))
    print(f"{'warm' if warm else 'cold'}: the service's folder is {folder}", file=sys.stderr)
    service_dir = folder / "svc"
    ports = {"--ray-port": _free_port(), "--dashboard-port": _free_port(),
             "--mlflow-port": _free_port()}
    address = f"http://127.0.0.1:{ports['--dashboard-port']}"
    env = {**os.environ, "PRECISION_TUNER_SERVICE": address}
    start = ["service", "start", "--dir", str(service_dir)]
    for flag, port in ports.items():
        start += [flag, str(port)]
    if not warm:
        start += ["--warm-workers", "0"]
    began = time.perf_counter()
    cli(*start, env=env)
    figures = {"service start-up": time.perf_counter() - began}
    try:
        from mlflow import MlflowClient
        from ray.job_submission import JobSubmissionClient

        jobs = JobSubmissionClient(address)
        mlflow = MlflowClient(f"http://127.0.0.1:{ports['--mlflow-port']}")

        def submit() -> tuple[str, float]:
            submitted = time.perf_counter()
            submitted_at.append(time.time())
            out = cli("submit", task, "--trials", trials, "--steps", steps, env=env)
            figures.setdefault("the submit command itself", time.perf_counter() - submitted)
            return out.strip().splitlines()[-1], submitted

        def first_trial(job: str) -> float:
            """Seconds from the submit command's start until the job's first trial run was
            opened in MLflow: the run's own start time (set by the job's driver on this
            machine's clock), not when a poll here first saw it."""
            while True:
                runs = mlflow.search_runs(
                    [e.experiment_id for e in mlflow.search_experiments()],
                    filter_string=f"tags.`precision_tuner.job_id` = '{job}' and "
                                  "tags.`precision_tuner.kind` = 'trial'",
                    order_by=["attributes.start_time ASC"], max_results=1)
                if runs:
                    return runs[0].info.start_time / 1000.0 - submitted_at[0]
                time.sleep(0.2)

        def wait(job: str) -> float:
            while not jobs.get_job_status(job).is_terminal():
                time.sleep(0.3)
            assert jobs.get_job_status(job).value == "SUCCEEDED", jobs.get_job_logs(job)[-2000:]
            return time.perf_counter()

        figures["Ray's floor: submit to a bare entrypoint's start"] = statistics.median(
            ray_floor(jobs, folder, wait) for _ in range(3))
        submitted_at: list[float] = []
        singles = []
        for index in range(max(1, singles_count)):
            if index:
                _settle(service_dir)
            submitted_at.clear()
            job, submitted = submit()
            opened = first_trial(job)
            done = wait(job) - submitted
            timing = _timing(service_dir, job)
            singles.append({"job": job, "first trial": opened, "done": done,
                            "outside": done - timing["wall_s"],
                            "start-up": timing["phases"]["start-up"],
                            "phases": timing["phases"]})
        first_trials = [single["first trial"] for single in singles]
        figures["submit to first trial opened"] = statistics.median(first_trials)
        figures["one job, submit to done"] = statistics.median(s["done"] for s in singles)
        figures["one job: outside its own clock"] = statistics.median(
            s["outside"] for s in singles)
        figures["first job's start-up phase"] = singles[0]["start-up"]
        pairs = _pairs(submit, wait, lambda: _settle(service_dir), repeats) if repeats else []
        later = [s["start-up"] for s in singles[1:]] or (
            [_start_up_phase(service_dir, pairs[0]["one after the other jobs"][-1])]
            if pairs else [])
        if later:
            figures["a later job's start-up phase"] = statistics.median(later)
        print(f"  single jobs: {singles}", file=sys.stderr)
        print(f"  pairs: {pairs}", file=sys.stderr)
        for name in ("one after the other", "together") if pairs else ():
            figures[f"two jobs {name} (median)"] = statistics.median(
                p[name] for p in pairs)
            figures[f"their re-measurements, {name} (median)"] = statistics.median(
                _remeasured(service_dir, p[f"{name} jobs"]) for p in pairs)
    finally:
        cli("service", "stop", "--dir", str(service_dir), env=env)
    ratios = sorted(p["together"] / p["one after the other"] for p in pairs)
    return {"figures": {name: round(seconds, 2) for name, seconds in figures.items()},
            "submit_to_first_trial_each": [round(s, 2) for s in sorted(first_trials)],
            "together_over_sequential": round(statistics.median(ratios), 3) if ratios else None,
            "together_over_sequential_each": [round(r, 3) for r in ratios]}


def _submit_and_wait(submit, wait) -> str:
    job, _ = submit()
    wait(job)
    return job


def _pairs(submit, wait, settle, repeats: int) -> list[dict]:
    """``repeats`` times two jobs one after the other and two submitted together, in turns
    (AB BA ...), each from a settled service: a pair's time moves with how many rounds its
    re-measurements need (4-8 for tiny_mlp), so one comparison alone says little."""
    pairs = []
    for index in range(repeats):
        pair: dict = {}
        for name in (("one after the other", "together") if index % 2 == 0
                     else ("together", "one after the other")):
            settle()
            began = time.perf_counter()
            if name == "together":
                jobs = [submit()[0] for _ in range(2)]
                for job in jobs:
                    wait(job)
            else:
                jobs = [_submit_and_wait(submit, wait) for _ in range(2)]
            pair[name], pair[f"{name} jobs"] = time.perf_counter() - began, jobs
        pairs.append(pair)
    return pairs


def _remeasured(service_dir: Path, jobs: list[str]) -> float:
    """The jobs' re-measurement phases together (waiting for the node included)."""
    return sum(_timing(service_dir, job)["phases"].get("re-measurement", 0.0) for job in jobs)


def _settle(service_dir: Path, wait_s: float = 60.0) -> None:
    """Until the service's spare drivers are all ready again (a warm service's steady state;
    the keeper replaces the ones taken once no job runs), so that each comparison starts
    from the same state."""
    from tuner.service.contract import DRIVERS, READY, SPARES

    folder = service_dir / DRIVERS
    deadline = time.monotonic() + wait_s
    while folder.is_dir() and len(list(folder.glob(f"*{READY}"))) < SPARES \
            and time.monotonic() < deadline:
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", default=str(ROOT / "tests/fixtures/tasks/tiny_mlp.py"))
    parser.add_argument("--trials", default="4")
    parser.add_argument("--steps", default="20")
    parser.add_argument("--table", action="store_true",
                        help="print the service page's table (docs/how-to/service.md) from the "
                             "results file and exit")
    parser.add_argument("--pairs", type=int, default=2,
                        help="how many times to compare two jobs together with one after the "
                             "other (in turns) [default: %(default)s]")
    parser.add_argument("--singles", type=int, default=3,
                        help="how many single jobs (each from a settled service) give the "
                             "one-job figures, their medians [default: %(default)s]")
    parser.add_argument("--only", choices=("cold", "warm"),
                        help="run one scenario and print it, keeping its folder for a look at "
                             "its jobs (the results file is not written)")
    options = parser.parse_args()
    if options.table:
        print(table(json.loads(RESULTS.read_text())))
        return
    results = {"task": Path(options.task).name,
               "flags": f"--trials {options.trials} --steps {options.steps}",
               "cpus": os.cpu_count(), "cpu": _cpu_model(), "measured": time.strftime("%Y-%m-%d")}
    for kind in (options.only,) if options.only else ("cold", "warm"):
        results[kind] = scenario(options.task, options.trials, options.steps, kind == "warm",
                                 options.pairs, options.singles)
        print(f"{kind}: {json.dumps(results[kind], indent=1)}", file=sys.stderr)
    if options.only:
        return
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    print(f"written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
