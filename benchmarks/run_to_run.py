"""How far one tune's speedup moves from run to run, on this machine: the figure behind the
exported interval's run-to-run allowance (``tuner.judging.noise.RUN_DRIFT_SD``).

A tune times float32 and its finalists in paired rounds, back to back in one worker, over
about a minute; its interval covers the rounds' spread. It cannot cover what moves the whole
level between one minute and the next: on the 2-core Xeon, eight digits tunes exported the
same pick at 1.35-1.65x with intervals of +-2-4%, while fresh-process A/B runs read 1.54-1.56x
(the first session in the results file). This
script measures that spread: it runs ``--tunes`` tunes of TASK.py one after another, and after
each an A/B pair of the exported config against float32, each side in a fresh process through
the public API only (``PrecisionConfig.load``, ``scope()``, ``wrap_optimizer()``), so the A/B
figures are taken at the tunes' times but outside the tuner.

It reports the between-run standard deviation of the log speedup (the tunes' spread less what
their own intervals already explain), and how many exported intervals hold the A/B median:
as they were exported (this run's rounds, and the allowance they were exported with) and
with the rounds alone. Each invocation adds a session to the results file; the recommended
allowance is the largest session's between-run sd (``with_recommendation``), which is what
``RUN_DRIFT_SD`` must be (tests/judging/test_benchmark_results.py).

    python benchmarks/run_to_run.py [TASK.py] [--tunes 6] [--space quick] [--ab-steps 100]

Results go to benchmarks/results/run_to_run.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tuner.machine import machine_description  # noqa: E402 - the repository's own

RESULTS = ROOT / "benchmarks" / "results" / "run_to_run.json"
Z95 = 1.96

# One side of an A/B pair, in a fresh process: the task trained with plain Keras (float32)
# or under the exported config, timing each of fit's steps; prints the median step in ms.
_AB_CHILD = r"""
import importlib.util, json, os, statistics, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras, tensorflow as tf
task_path, config_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = importlib.util.spec_from_file_location("task", task_path)
task = importlib.util.module_from_spec(spec)
spec.loader.exec_module(task)
keras.utils.set_random_seed(0)
optimizer = task.make_optimizer() if hasattr(task, "make_optimizer") else keras.optimizers.Adam()
if config_path == "float32":
    model = task.build_model()
    model.compile(optimizer, task.LOSS)
else:
    import tuner
    config = tuner.PrecisionConfig.load(config_path)
    with config.scope():
        model = task.build_model()
        model.compile(config.wrap_optimizer(optimizer), task.LOSS)
data = task.train_data()
if isinstance(data, tuple):
    data = tf.data.Dataset.from_tensor_slices(data).batch(getattr(task, "BATCH_SIZE", 32))
times = []
class Clock(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.started = time.perf_counter()
    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])
        times.append(time.perf_counter() - self.started)
model.fit(data.repeat().prefetch(2), steps_per_epoch=steps, epochs=1, verbose=0,
          callbacks=[Clock()])
print(json.dumps({"median_ms": 1000 * statistics.median(times[max(3, steps // 10):])}))
"""


def _ab_side(task: Path, config: str, steps: int) -> float:
    done = subprocess.run([sys.executable, "-c", _AB_CHILD, str(task), config, str(steps)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"A/B side {config} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["median_ms"]


def _tune(task: Path, run_dir: Path, space: str) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tuner", "tune", str(task), "--space", space,
                           "--run-dir", str(run_dir), "--out", str(run_dir / "best.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"the tune failed:\n{done.stderr[-3000:]}")
    best = json.loads((run_dir / "best.json").read_text())
    provenance = best["provenance"]
    exported = provenance.get("speedup_interval") or [1.0, 1.0]
    this_run = provenance.get("speedup_interval_this_run") or exported
    return {"config": best["policy"],
            "speedup": provenance.get("speedup_vs_float32", 1.0),
            "interval": exported, "interval_this_run": this_run,
            "run_drift_sd": provenance.get("run_drift_sd", 0.0),
            "wall_s": round(time.perf_counter() - started, 1)}


def between_run_sd(runs: list[dict]) -> float:
    """The standard deviation of the log speedup between runs beyond each run's own: the
    tunes' sample variance less the mean variance their rounds' intervals stand for."""
    logs = [math.log(run["speedup"]) for run in runs]
    if len(logs) < 2:
        return 0.0
    within = statistics.fmean(
        (math.log(run["interval_this_run"][1] / run["interval_this_run"][0]) / 2 / Z95) ** 2
        for run in runs)
    return math.sqrt(max(0.0, statistics.variance(logs) - within))


def _holds(interval: list[float], value: float) -> bool:
    return interval[0] <= value <= interval[1]


def summarize(runs: list[dict], ab: list[float]) -> dict:
    truth = statistics.median(ab)
    logs = [math.log(run["speedup"]) for run in runs]
    return {
        "speedups": [run["speedup"] for run in runs],
        "sd_log_speedup": round(statistics.stdev(logs), 4) if len(logs) > 1 else 0.0,
        "between_run_sd": round(between_run_sd(runs), 4),
        "ab_each": sorted(round(value, 3) for value in ab),
        "ab_median": round(truth, 3),
        "held_as_exported": sum(_holds(run["interval"], truth) for run in runs),
        "held_by_rounds_alone": sum(_holds(run["interval_this_run"], truth) for run in runs),
        "tunes": len(runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", nargs="?", default=str(ROOT / "examples" / "digits_mlp.py"))
    parser.add_argument("--tunes", type=int, default=6)
    parser.add_argument("--space", default="quick")
    parser.add_argument("--ab-steps", type=int, default=100)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    task = Path(args.task).resolve()
    runs, ab = [], []
    with tempfile.TemporaryDirectory(prefix="pt-run-to-run-") as scratch:
        for index in range(args.tunes):
            run = _tune(task, Path(scratch) / f"tune{index}", args.space)
            config = str(Path(scratch) / f"tune{index}" / "best.json")
            # One A/B pair after each tune, its order alternating (ABBA over the tunes).
            sides = ("float32", config) if index % 2 == 0 else (config, "float32")
            ms = {side: _ab_side(task, side, args.ab_steps) for side in sides}
            run["ab"] = round(ms["float32"] / ms[config], 4)
            ab.append(run["ab"])
            runs.append(run)
            print(f"tune {index + 1}/{args.tunes}: {run['config']} {run['speedup']:.2f}x "
                  f"{run['interval']} (rounds alone {run['interval_this_run']}); "
                  f"A/B after it {run['ab']:.2f}x", flush=True)
    session = {"task": task.name, "space": args.space, "cpu": machine_description(),
               "cpus": os.cpu_count(),
               "measured_at": time.strftime("%Y-%m-%d %H:%M"),
               "source": f"benchmarks/run_to_run.py --tunes {args.tunes}, "
                         f"A/B of {args.ab_steps} steps after each tune",
               "runs": runs, "summary": summarize(runs, ab)}
    out = Path(args.out)
    earlier = json.loads(out.read_text())["sessions"] if out.is_file() else []
    results = with_recommendation([*earlier, session])
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(session["summary"], indent=1))
    print(f"recommended run-to-run sd: {results['recommended_sd']} (the largest session's)")


def with_recommendation(sessions: list[dict]) -> dict:
    """The results file: every session measured, and the allowance they support: the largest
    session's between-run sd, rounded up to the next 0.01 (the level's move comes in spells:
    one calm session cannot speak for the next)."""
    largest = max(session["summary"]["between_run_sd"] for session in sessions)
    return {"sessions": sessions, "recommended_sd": math.ceil(largest * 100 - 1e-9) / 100}


if __name__ == "__main__":
    main()
