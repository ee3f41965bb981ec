"""What the precision guard costs a user's training: the wall time of the whole ``fit``.

    .venv/bin/python benchmarks/guard_overhead.py [--rounds 5] [--epochs 2] [--seconds 3]
        [--task examples/digits_mlp.py --task ...] [--policy mixed_bfloat16]

For each task (default: the digits MLP, house prices and the text transformer; any task file
with ``build_model`` and ``train_data`` returning arrays, compiled by its ``compile_model``
where it has one), trains it under the policy with and without ``cfg.guard()``, each in a fresh
process, in ABBA order (plain, guarded, guarded, plain per round). The task's arrays are
repeated so that an epoch has at least ``--steps-per-epoch`` steps (the examples' own epochs
are 7 to 64 steps, shorter than a real training's), and more where the timed epochs would
last less than ``--seconds`` (a first plain run measures the step; a 1 ms step needs
thousands for the machine's noise to average out); one ``fit`` call trains a warm-up epoch
(tracing, the first snapshot) and then ``--epochs`` more, and the figure is the wall time
from the second epoch's start to ``fit``'s return: every step, every callback's work (the
guard's reads of its steps, its snapshots,
its checks every ``check_every`` steps and at each epoch's end, its end-of-training record)
and Keras's own bookkeeping, as the user pays them. No per-step timing callback runs in either
arm (one timestamp at the second epoch's start, the same in both). Each round gives the ratio
guarded/plain of its two pairs' sums. Prints the median ratio with a 95% interval from the
rounds (t on the log ratios) and writes benchmarks/results/guard_overhead.json (the digits MLP)
or guard_overhead_<task>.json; ``--table`` prints the guard page's table from those files. Run
it on an otherwise idle machine.
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
sys.path.insert(0, str(ROOT))

from tuner.machine import machine_description  # noqa: E402 - after the repository's path

RESULTS = ROOT / "benchmarks" / "results" / "guard_overhead.json"
EXAMPLES = ("digits_mlp", "house_prices", "text_transformer")
# The guard page's table: the examples, then small-step models of other kinds (an embedding
# with a tiny head, two optimizers in a custom train_step) run with --task.
TABLED = EXAMPLES + ("embedding_head", "two_optimizers")
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}

CHILD = r"""
import importlib.util, json, math, sys, time
import keras
import numpy as np
from tuner import PrecisionConfig
guarded, epochs, policy = sys.argv[1] == "1", int(sys.argv[2]), sys.argv[4]
steps_per_epoch = int(sys.argv[5])
spec = importlib.util.spec_from_file_location("task", sys.argv[3])
task = importlib.util.module_from_spec(spec); spec.loader.exec_module(task)
keras.utils.set_random_seed(0)
cfg = PrecisionConfig(policy=policy)
x, y = task.train_data()
copies = math.ceil(steps_per_epoch * task.BATCH_SIZE / len(x))
x, y = np.concatenate([x] * copies), np.concatenate([y] * copies)

class SecondEpoch(keras.callbacks.Callback):
    # One timestamp: the start of the first timed epoch (the same in both arms).
    started = None
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1: SecondEpoch.started = time.perf_counter()

with cfg.scope():
    model = task.build_model()
if hasattr(task, "compile_model"):   # a model with its own compile (several optimizers)
    task.compile_model(model, cfg.wrap_optimizer)
else:
    optimizer = task.make_optimizer() if hasattr(task, "make_optimizer") else "adam"
    model.compile(optimizer=cfg.wrap_optimizer(keras.optimizers.get(optimizer)),
                  loss=task.LOSS, **cfg.compile_kwargs())
callbacks = [SecondEpoch()] + ([cfg.guard(verbose=0)] if guarded else [])
model.fit(x, y, batch_size=task.BATCH_SIZE, epochs=1 + epochs, shuffle=True, verbose=0,
          callbacks=callbacks)
elapsed = time.perf_counter() - SecondEpoch.started
print(json.dumps({"fit_s": elapsed, "steps": epochs * math.ceil(len(x) / task.BATCH_SIZE)}))
"""


def _time(guarded: bool, epochs: int, task: Path, policy: str, steps: int) -> tuple[float, int]:
    done = subprocess.run([sys.executable, "-c", CHILD, "1" if guarded else "0", str(epochs),
                           str(task), policy, str(steps)], capture_output=True, text=True,
                          env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin"}, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return figures["fit_s"], figures["steps"]


def _interval(ratios: list[float]) -> tuple[float, float]:
    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return float("nan"), float("nan")
    centre = statistics.mean(logs)
    half = _T95.get(len(logs) - 1, 2.0) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(centre - half), math.exp(centre + half)


def steps_for(task: Path, epochs: int, policy: str, steps: int, seconds: float) -> int:
    """Steps an epoch: at least ``steps``, and enough for ``epochs`` to last ``seconds``."""
    elapsed, _ = _time(False, epochs, task, policy, steps)
    return max(steps, math.ceil(steps * seconds / max(elapsed, 1e-3)))


def measure(task: Path, rounds: int, epochs: int, policy: str, steps: int) -> dict:
    ratios, rows, counted = [], [], 0
    for round_ in range(rounds):
        (plain_a, counted), (guarded_a, _) = (_time(False, epochs, task, policy, steps),
                                              _time(True, epochs, task, policy, steps))
        (guarded_b, _), (plain_b, _) = (_time(True, epochs, task, policy, steps),
                                        _time(False, epochs, task, policy, steps))
        ratio = (guarded_a + guarded_b) / (plain_a + plain_b)
        ratios.append(ratio)
        rows.append({"plain_s": [plain_a, plain_b], "guarded_s": [guarded_a, guarded_b],
                     "ratio": ratio})
        print(f"{task.stem} round {round_ + 1}: plain {1e3 * (plain_a + plain_b) / 2 / counted:.2f}"
              f" ms/step, guarded {1e3 * (guarded_a + guarded_b) / 2 / counted:.2f} ms/step, "
              f"ratio {ratio:.3f}", flush=True)
    low, high = _interval(ratios)
    plain_s = [s for row in rows for s in row["plain_s"]]
    return {"median_ratio": statistics.median(ratios), "interval_95": [low, high],
            "rounds": rows, "epochs": epochs, "steps_timed": counted,
            "plain_step_ms": round(1e3 * statistics.median(plain_s) / counted, 3),
            "statistic": f"wall time of fit over {epochs} epochs after a warm-up epoch",
            "model": str(task.relative_to(ROOT)) if task.is_relative_to(ROOT) else str(task),
            "policy": policy, "machine": machine_description()}


def results_of(stem: str) -> Path:
    return RESULTS if stem == "digits_mlp" else RESULTS.with_name(f"guard_overhead_{stem}.json")


def table(results: dict[str, dict]) -> str:
    """The guard page's table, from the results files of ``TABLED`` (``--table``)."""
    lines = ["| example | plain step | guarded / plain `fit`, median of rounds | 95% interval "
             "| each round |", "|---|---|---|---|---|"]
    for stem, figures in results.items():
        low, high = figures["interval_95"]
        each = ", ".join(f"{row['ratio']:.3f}" for row in figures["rounds"])
        lines.append(f"| `{figures['model']}` | {figures['plain_step_ms']:.2f} ms | "
                     f"x{figures['median_ratio']:.3f} | {low:.3f}-{high:.3f} | {each} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="the least time the timed epochs of one arm last (default 3)")
    parser.add_argument("--task", type=Path, action="append")
    parser.add_argument("--policy", default="mixed_bfloat16")
    parser.add_argument("--table", action="store_true",
                        help="print the guard page's table from the results files; time nothing")
    args = parser.parse_args()
    if args.table:
        print(table({stem: json.loads(results_of(stem).read_text()) for stem in TABLED}))
        return
    tasks = args.task or [ROOT / "examples" / f"{name}.py" for name in EXAMPLES]
    for task in (path.resolve() for path in tasks):
        steps = steps_for(task, args.epochs, args.policy, args.steps_per_epoch, args.seconds)
        summary = measure(task, args.rounds, args.epochs, args.policy, steps)
        results_of(task.stem).write_text(json.dumps(summary, indent=2) + "\n")
        low, high = summary["interval_95"]
        print(f"{task.stem}: the guard's fit x{summary['median_ratio']:.3f} [{low:.3f}-{high:.3f}]"
              f" (95% interval over {args.rounds} rounds; plain {summary['plain_step_ms']} "
              "ms/step)")


if __name__ == "__main__":
    main()
