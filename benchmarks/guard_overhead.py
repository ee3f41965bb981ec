"""The precision guard's step-time overhead (target: inside the machine's noise).

    .venv/bin/python benchmarks/guard_overhead.py [--rounds 4] [--epochs 8]
        [--task examples/digits_mlp.py] [--policy mixed_bfloat16]

Trains the task under the policy with and without ``cfg.guard()``, each in a fresh process, in
ABBA order (plain, guarded, guarded, plain per round), and times every step with the same
timing callback in both arms (from one step's start to the next: the guard's reads after each
step, its per-layer float32 comparison every 200 steps and at each epoch's end, and any repair
are inside; the clock's own cost is common to both). Each process's figure is its mean step
time after the first epoch (tracing excluded; the mean, not the median, so the periodic
comparison counts); each round gives the ratio guarded/plain of its two pairs' means. Prints
the median ratio with a 95% interval from the rounds (t on the log ratios) and writes
benchmarks/results/guard_overhead.json (the digits MLP) or guard_overhead_<task>.json. Run it
on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "guard_overhead.json"
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}

CHILD = r"""
import importlib.util, json, statistics, sys, time
import keras
from tuner import PrecisionConfig
guarded, epochs, policy = sys.argv[1] == "1", int(sys.argv[2]), sys.argv[4]
spec = importlib.util.spec_from_file_location("task", sys.argv[3])
task = importlib.util.module_from_spec(spec); spec.loader.exec_module(task)
keras.utils.set_random_seed(0)
from tuner.apply.config import LossScale
scale = LossScale("dynamic", floor=1e-6) if policy == "mixed_float16" else LossScale()
cfg = PrecisionConfig(policy=policy, loss_scale=scale)
x, y = task.train_data()

class Clock(keras.callbacks.Callback):
    # From one step's start to the next's: every callback's work (the guard's too) is inside.
    def __init__(self): super().__init__(); self.times = []; self.epoch = 0; self.start = None
    def on_epoch_begin(self, epoch, logs=None): self.epoch = epoch; self.start = None
    def on_train_batch_begin(self, batch, logs=None):
        now = time.perf_counter()
        if self.epoch > 0 and self.start is not None: self.times.append(now - self.start)
        self.start = now

with cfg.scope():
    model = task.build_model()
model.compile(optimizer=cfg.wrap_optimizer(task.make_optimizer()), loss=task.LOSS,
              **cfg.compile_kwargs())
clock = Clock()
callbacks = [clock] + ([cfg.guard()] if guarded else [])
model.fit(x, y, batch_size=task.BATCH_SIZE, epochs=epochs, shuffle=False, verbose=0,
          callbacks=callbacks)
print(json.dumps({"mean_step_s": statistics.fmean(clock.times), "steps": len(clock.times)}))
"""


def _time(guarded: bool, epochs: int, task: Path, policy: str) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, "1" if guarded else "0", str(epochs),
                           str(task), policy], capture_output=True,
                          text=True, env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin"},
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["mean_step_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--task", type=Path, default=ROOT / "examples" / "digits_mlp.py")
    parser.add_argument("--policy", default="mixed_bfloat16")
    args = parser.parse_args()
    task = args.task.resolve()

    def timed(guarded):
        return _time(guarded, args.epochs, task, args.policy)

    ratios, rows = [], []
    for round_ in range(args.rounds):
        plain_a, guarded_a = timed(False), timed(True)
        guarded_b, plain_b = timed(True), timed(False)
        ratio = (guarded_a + guarded_b) / (plain_a + plain_b)
        ratios.append(ratio)
        rows.append({"plain_s": [plain_a, plain_b], "guarded_s": [guarded_a, guarded_b],
                     "ratio": ratio})
        print(f"round {round_ + 1}: plain {1e3 * (plain_a + plain_b) / 2:.2f} ms, guarded "
              f"{1e3 * (guarded_a + guarded_b) / 2:.2f} ms, ratio {ratio:.3f}", flush=True)
    logs = [math.log(r) for r in ratios]
    centre = statistics.mean(logs)
    half = _T95.get(len(logs) - 1, 2.0) * statistics.stdev(logs) / math.sqrt(len(logs)) \
        if len(logs) > 1 else float("nan")
    low, high = math.exp(centre - half), math.exp(centre + half)
    summary = {"median_ratio": statistics.median(ratios), "interval_95": [low, high],
               "rounds": rows, "epochs": args.epochs, "statistic": "mean step time",
               "model": str(task.relative_to(ROOT)) if task.is_relative_to(ROOT) else str(task),
               "policy": args.policy}
    results = RESULTS if task.name == "digits_mlp.py" else \
        RESULTS.with_name(f"guard_overhead_{task.stem}.json")
    results.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"guard overhead: step time x{summary['median_ratio']:.3f} "
          f"[{low:.3f}-{high:.3f}] (95% interval over {len(ratios)} rounds)")


if __name__ == "__main__":
    main()
