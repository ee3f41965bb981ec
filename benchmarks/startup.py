"""A tune's fixed cost against its floor: one run per example.

    python benchmarks/startup.py [--examples digits_mlp audio_cnn text_transformer] [--floors 3]

For each example:
  1. the floor any tool pays before it can time a trial: a fresh process that imports
     TensorFlow, loads the task file, builds and compiles its model and runs one compiled
     training step on one batch (the median of ``--floors`` runs);
  2. the example's `precision-tuner tune --space quick` with no other flag (the executor the
     default picks), through the real CLI; from its timing.json, the time before its first
     trial (start-up, task check, ceiling probe, diagnostics and opening the records) and the
     share of its wall time outside training and tracing.
Targets: before the first trial at most 1.5x the floor; the outside share at most 0.30.

Results go to benchmarks/results/startup_<label>.json, and docs/BENCHMARKS.md is rebuilt
(`python benchmarks/grid_vs_tuner.py --doc-only` renders every results file). Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import grid_vs_tuner  # noqa: E402 - the CLI run and the machine, said once there

RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {"floor_ratio": 1.5, "outside_share": 0.30}
BEFORE_FIRST_TRIAL = ("start-up", "task check", "ceiling probe", "diagnostics",
                      "opening records")

FLOOR = r'''
import importlib.util, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import keras
spec = importlib.util.spec_from_file_location("task", sys.argv[1])
task = importlib.util.module_from_spec(spec)
spec.loader.exec_module(task)
data = task.train_data()
model = task.build_model()
if hasattr(task, "compile_model"):   # a model with its own compile (a GAN): as it asks
    task.compile_model(model, lambda optimizer: optimizer)
else:
    optimizer = task.make_optimizer() if hasattr(task, "make_optimizer") else "adam"
    model.compile(optimizer=optimizer, loss=getattr(task, "LOSS", None))
size = getattr(task, "BATCH_SIZE", 32)
if isinstance(data, tf.data.Dataset):
    batch = next(iter(data))
    x, y = batch if isinstance(batch, tuple) else (batch, None)
else:
    x, y = data if isinstance(data, tuple) else (data, None)
    x = tf.nest.map_structure(lambda a: a[:size], x)
    y = None if y is None else tf.nest.map_structure(lambda a: a[:size], y)
model.train_on_batch(x, y)
'''


def floor(task: Path) -> float:
    """Seconds from a fresh process's start to its first compiled training step done."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", FLOOR, str(task)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"benchmark: the floor of {task.name} failed:\n{done.stderr[-3000:]}")
    return seconds


def bench_example(name: str, floors: int, work: Path) -> dict:
    task = ROOT / "examples" / f"{name}.py"
    print(f"[{name}] the floor ({floors} fresh processes)...", flush=True)
    floor_runs = [round(floor(task), 2) for _ in range(floors)]
    print(f"[{name}] quick tune, no flags...", flush=True)
    quick = grid_vs_tuner.tune(task, "quick", work / f"{name}-quick")
    phases = quick["timing"]["phases"]
    before = sum(phases.get(phase, 0.0) for phase in BEFORE_FIRST_TRIAL)
    run = json.loads((work / f"{name}-quick" / "run.json").read_text())
    row = {"example": name, "floor_s": floor_runs, "floor_median_s": statistics.median(floor_runs),
           "before_first_trial_s": round(before, 2),
           "before_first_trial": {phase: round(phases.get(phase, 0.0), 2)
                                  for phase in BEFORE_FIRST_TRIAL},
           "floor_ratio": round(before / statistics.median(floor_runs), 3),
           "outside_share": quick["outside_share"], "wall_s": quick["tuner_wall_s"],
           "shutdown_s": round(phases.get("shutdown", 0.0), 2),
           "executor": run.get("executor"), "breakdown": quick["breakdown"]}
    print(f"[{name}] before the first trial {before:.1f} s against a floor of "
          f"{row['floor_median_s']:.1f} s ({row['floor_ratio']:.2f}x); "
          f"{row['outside_share']:.0%} of {row['wall_s']:.0f} s outside training and tracing; "
          f"executor {row['executor']}", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", nargs="+",
                        default=["digits_mlp", "audio_cnn", "text_transformer"])
    parser.add_argument("--floors", type=int, default=3, help="fresh-process floor runs")
    parser.add_argument("--label", help="results name [default: cpu, or gpu with a GPU]")
    args = parser.parse_args()
    info = grid_vs_tuner.machine()
    label = args.label or ("gpu" if info["gpu"] else "cpu")
    with tempfile.TemporaryDirectory(prefix="precision-tuner-startup-") as tmp:
        rows = [bench_example(name, args.floors, Path(tmp)) for name in args.examples]
    data = {"label": label, "date": time.strftime("%Y-%m-%d"), "machine": info,
            "targets": TARGETS, "examples": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"startup_{label}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    grid_vs_tuner.write_doc()
    print(f"wrote {out.relative_to(ROOT)} and {grid_vs_tuner.DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
