"""``precision-tuner gpu-check`` (``make gpu-check``): what a user with an NVIDIA GPU runs once,
about five minutes, and pastes into an issue. It tunes a model large enough for tensor cores
(a task file of its own, written to the check's folder), benches the pick against float32 in
fresh processes, trains it with the guard against float32, and prints a short report: the
devices the processes saw, TensorFlow and TF32, the device's ceiling, the pick with its
speedup interval, the bench's, and the training's verdict. Each step is the real command, in
its own process, its output in ``DIR/<step>.log``. On a machine without a GPU it says so and
runs to the end on the CPU: the same path, with nothing of the GPU's to report.

Driver side: no TensorFlow imported here (the steps' processes import it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tuner.execution.gpus import visible_gpu_ids

# A model whose products reach a GPU's tensor cores (1024-wide layers, batch 512), on data of
# its own (no download), with a validation set for the training's verdict.
TASK = '''"""precision-tuner gpu-check's model: 1024-wide dense layers on synthetic data."""
import keras
import numpy as np

BATCH_SIZE = 512
LOSS = "sparse_categorical_crossentropy"


def _data(count, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(count, 256)).astype("float32")
    w = np.random.default_rng(7).normal(size=(256, 10))
    return x, (x @ w).argmax(axis=1).astype("int64")


def build_model():
    inputs = keras.Input(shape=(256,))
    h = inputs
    for _ in range(3):
        h = keras.layers.Dense(1024, activation="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))


def make_optimizer():
    return keras.optimizers.Adam(1e-3)


def train_data():
    return _data(16384, 0)


def val_data():
    return _data(4096, 1)
'''

WHAT_A_GPU_CHECKS = (
    "on a GPU it checks: that each process turns on memory growth before TensorFlow "
    "allocates, the device's 16-bit ceiling on its tensor cores, whether float32 runs in TF32, "
    "the speedup a 16-bit pick keeps in fresh processes, and a guarded training against float32")


def add_parser(commands) -> None:
    check = commands.add_parser(
        "gpu-check", help="tune, bench and train a test model on this machine's GPU and print "
                          "a report to paste into an issue (about five minutes)",
        description=__doc__.split("\n\n")[0].replace("``", ""))
    check.add_argument("--dir", type=Path, default=Path("runs/gpu-check"),
                       help="where the task, the logs and the report go [default: %(default)s]")
    check.add_argument("--epochs", type=int, default=3,
                       help="epochs of the guarded training [default: %(default)s]")


def run(args) -> int:
    folder: Path = args.dir
    folder.mkdir(parents=True, exist_ok=True)
    gpus = visible_gpu_ids()
    if gpus:
        print(f"gpu-check: {len(gpus)} NVIDIA device(s) visible ({', '.join(gpus)})")
    else:
        print("gpu-check: no NVIDIA GPU visible (nvidia-smi lists none, or "
              f"CUDA_VISIBLE_DEVICES hides them): the check runs on the CPU. {WHAT_A_GPU_CHECKS}")
    task = folder / "gpu_check_task.py"
    task.write_text(TASK)
    best, run_dir = folder / "best_precision.json", folder / "tune"
    steps = [("tune", ["tune", str(task), "--space", "quick", "--run-dir", str(run_dir),
                       "--out", str(best), "--force", "--no-confirm"]),
             ("bench", ["bench", str(task), "--config", str(best), "--rounds", "2",
                        "--json", str(folder / "bench.json")]),
             ("train", ["train", str(task), "--config", str(best), "--epochs",
                        str(args.epochs), "--against", "float32", "--run-dir",
                        str(folder / "train")])]
    failed = None
    for name, command in steps:
        failed = failed or _step(name, command, folder)
    text = report(gpus, run_dir, best, folder, failed)
    (folder / "report.md").write_text(text + "\n")
    print("\n----- paste from here -----\n" + text + "\n----- to here -----")
    print(f"(also in {folder / 'report.md'}; each step's output in {folder}/<step>.log)")
    return 1 if failed else 0


def _step(name: str, command: list[str], folder: Path) -> str | None:
    """Run one step's command; its name where it failed, else None."""
    started = time.perf_counter()
    print(f"gpu-check: {name} ...", flush=True)
    with (folder / f"{name}.log").open("w") as log:
        done = subprocess.run([sys.executable, "-m", "tuner", *command], stdout=log,
                              stderr=subprocess.STDOUT)
    took = time.perf_counter() - started
    print(f"gpu-check: {name} {'done' if done.returncode == 0 else 'FAILED'} in {took:.0f} s",
          flush=True)
    return None if done.returncode == 0 else name


def _speeds(speeds: dict | None) -> str:
    return ", ".join(f"{dtype} {value:.2f}" for dtype, value in (speeds or {}).items()) or "?"


def _round(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "?"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def report(gpus: list[str], run_dir: Path, best: Path, folder: Path, failed: str | None) -> str:
    """The report's lines, from what each step recorded."""
    from tuner import __version__

    run, bench, train = (_read(run_dir / "run.json"), _read(folder / "bench.json"),
                         _read(folder / "train" / "train.json"))
    provenance = _read(best).get("provenance", {})
    ceiling = run.get("ceiling") or {}
    devices = {name: (entry or {}).get("devices") for name, entry in
               (train.get("runs") or {}).items()}
    lines = [f"precision-tuner {__version__} gpu-check",
             f"- NVIDIA devices visible: {', '.join(gpus) or 'none'}",
             f"- TensorFlow {provenance.get('tensorflow', '?')}, Keras "
             f"{provenance.get('keras', '?')}; machine: {provenance.get('machine', '?')}",
             f"- float32's products: {(run.get('tf32') or {}).get('float32_products', '?')} "
             f"(TF32 {json.dumps(run.get('tf32'))})",
             f"- ceiling on {ceiling.get('device', '?')} (x float32's speed): a 256-wide step "
             f"{_speeds(ceiling.get('speed'))}; "
             f"peak {_speeds((ceiling.get('peak') or {}).get('speed'))}"]
    if provenance:
        low, high = provenance.get("speedup_interval", [None, None])
        lines.append(f"- pick: {_read(best).get('policy', '?')} at "
                     f"{_round(provenance.get('speedup_vs_float32'))}x "
                     f"[{_round(low)}-{_round(high)}] vs float32")
    if bench:
        speed = bench.get("speedup", {})
        lines.append(f"- bench (fresh processes): {_round(speed.get('ratio'))}x "
                     f"[{_round(speed.get('low'))}-{_round(speed.get('high'))}], "
                     f"{bench.get('verdict')}")
    if train:
        judged = train.get("verdict") or {}
        lines.append(f"- guarded training vs float32: {judged.get('measure')} ratio "
                     f"{_round(judged.get('ratio'))} (worse: {judged.get('worse')}), "
                     f"{len(train.get('events', []))} guard event(s)")
        lines.append(f"- each training's devices: {json.dumps(devices)}")
    if failed:
        lines.append(f"- FAILED at: {failed} (see {folder / (failed + '.log')})")
    return "\n".join(lines)
