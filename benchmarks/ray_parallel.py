"""What Ray parallelism buys and costs on this machine, as ratios measured in one run.

    python benchmarks/ray_parallel.py [--task examples/digits_mlp.py] [--trials 6]

Reports:
  1. study wall time with 2 workers vs 1 (same task, space, trials, seed; via the real CLI);
  2. Ray start-up and per-trial overhead (ray.init, actor start incl. TensorFlow import,
     trial wall time outside training steps on a warm actor);
  3. parallel vs exclusive timing: the same float32 trial timed alone on a node-reserving
     worker, and timed while a second trial runs beside it: why the exclusive phase exists.
Run it on an otherwise idle machine. Results go to benchmarks/results/ray_parallel.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def study_wall_time(task: str, trials: int, workers: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tuner", "tune", task, "--space", "quick",
                        "--trials", str(trials), "--steps", str(steps), "--workers",
                        str(workers), "--run-dir", f"{tmp}/run", "--out", f"{tmp}/best.json"],
                       cwd=ROOT, check=True, capture_output=True, timeout=3600)
        return time.perf_counter() - started


def overheads_and_interference(task: str, steps: int) -> dict:
    import ray

    from tuner.apply.config import PrecisionConfig
    from tuner.execution.ray_pool import RayExecutor
    from tuner.trial_types import TrialSpec

    def spec(n: int) -> TrialSpec:
        return TrialSpec(n, task, PrecisionConfig().to_dict(), steps, 5)

    started = time.perf_counter()
    executor = RayExecutor(workers=2)
    ray_start_s = time.perf_counter() - started
    started = time.perf_counter()
    executor._fill_pool()
    actors_start_s = time.perf_counter() - started
    executor.run(spec(0), 600)  # warm: data materialised, functions traced once
    warm = [executor.run(spec(i), 600) for i in range(1, 4)]
    round_trips = []
    for result in warm:
        round_trips.append(result.wall_s - result.train_s)
    # Side by side: two identical trials at once on the same node.
    side_by_side = []
    for index in range(3):
        executor.submit(spec(10 + 2 * index), 600)
        executor.submit(spec(11 + 2 * index), 600)
        done = []
        while executor.in_flight():
            done += executor.wait_any()
        side_by_side += [r.median_step_ms for r in done]
    with executor.exclusive() as session:
        exclusive = [session.run(spec(20 + i), 600).median_step_ms for i in range(3)]
    executor.close()
    ray.shutdown()
    pool_alone = statistics.median(r.median_step_ms for r in warm)
    return {
        "ray_start_s": round(ray_start_s, 2),
        "two_actors_start_s": round(actors_start_s, 2),
        "trial_outside_steps_s": round(statistics.median(round_trips), 3),
        "median_step_ms_pool_worker_alone": round(pool_alone, 3),
        "median_step_ms_side_by_side": round(statistics.median(side_by_side), 3),
        "median_step_ms_exclusive_node": round(statistics.median(exclusive), 3),
        "side_by_side_vs_exclusive": round(statistics.median(side_by_side)
                                           / statistics.median(exclusive), 3),
        "spread_side_by_side_pct": round(100 * (max(side_by_side) - min(side_by_side))
                                         / statistics.median(side_by_side), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="examples/digits_mlp.py")
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    task = str((ROOT / args.task).resolve())
    one = study_wall_time(task, args.trials, 1, args.steps)
    two = study_wall_time(task, args.trials, 2, args.steps)
    report = {"task": args.task, "trials": args.trials, "steps": args.steps,
              "machine": platform.processor() or platform.machine(),
              "study_wall_s_1_worker": round(one, 1), "study_wall_s_2_workers": round(two, 1),
              "wall_2_workers_vs_1": round(two / one, 3),
              **overheads_and_interference(task, args.steps)}
    from tuner.machine import machine_description

    report["machine"] = machine_description()
    out = ROOT / "benchmarks" / "results" / "ray_parallel.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    width = max(map(len, report))
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
