"""The memory a tune of arrays given from Python holds: ``tuner.tune(train_data=(x, y))`` with
``--gib`` GiB of arrays, ``executor="ray"`` and ``--workers`` (each takes a CPU: 2 on a 2-core
machine), against the same tune of 0.01 GiB. Each tune runs in a fresh process; the peak of
the summed proportional set size (PSS, ``/proc/PID/smaps_rollup``: a page shared by k
processes counts 1/k in each) of that process and every process under it (Ray's and its
workers) is sampled every 0.2 s.

    python benchmarks/data_memory.py [--gib 1.0] [--workers 2] [--out FILE]

Results go to benchmarks/results/data_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "data_memory.json"
GIB = 1 << 30

SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path

    import keras
    import numpy as np

    import tuner

    gib, workers, run_dir = float(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    rows = max(2048, int(gib * (1 << 30) / (256 * 4)))
    x = np.random.default_rng(0).standard_normal((rows, 256), dtype=np.float32)  # no float64 copy
    y = (x[:, 0] > 0).astype("int32")

    def build_model():
        inputs = keras.Input(shape=(256,))
        hidden = keras.layers.Dense(32, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(hidden))

    tuner.tune(build_model=build_model, train_data=(x, y),
               loss="sparse_categorical_crossentropy", space="quick", trials=3, steps=12,
               confirm_seconds=3, workers=workers, executor="ray", run_dir=run_dir)
    print("done", flush=True)
""")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(parent, []).append(int(entry.name))
    return tree


def tree_pss(root: int) -> int:
    """Summed PSS (bytes) of ``root`` and every process under it."""
    tree, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        todo += tree.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def one_tune(gib: float, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "tune_arrays.py"
        script.write_text(SCRIPT)
        process = subprocess.Popen([sys.executable, str(script), str(gib), str(workers),
                                    str(Path(folder) / "run")], cwd=folder,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "RAY_DEDUP_LOGS": "0"})
        peak, stop = [0], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], tree_pss(process.pid))
                stop.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        began = time.time()
        sampler.start()
        output = process.communicate()[0]
        stop.set()
        sampler.join()
        if process.returncode != 0 or "done" not in output:
            raise SystemExit(f"the tune of {gib} GiB with {workers} workers failed:\n"
                             f"{output[-3000:]}")
        return {"gib": gib, "workers": workers, "peak_pss_gib": round(peak[0] / GIB, 2),
                "wall_s": round(time.time() - began, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs = []
    for workers in args.workers:
        for gib in (0.01, args.gib):
            runs.append(one_tune(gib, workers))
            print(json.dumps(runs[-1]), flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "")
    args.out.write_text(json.dumps({"machine": f"{os.cpu_count()} CPUs ({cpu})",
                                   "measured": time.strftime("%Y-%m-%d"), "runs": runs},
                                  indent=1) + "\n")


if __name__ == "__main__":
    main()
