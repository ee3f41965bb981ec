"""``precision-tuner train``: a task's whole training under a config with the precision guard,
and with ``against="float32"`` the same training in float32 beside it (two processes at once:
the figures compared are validation losses, not times). Shows each epoch's validation losses
as they arrive, then a table, and writes ``train.json`` in the run directory: each run's
per-epoch ``val_loss``, the final ``ratio`` (the config's last validation loss over float32's),
the guard's ``events`` and the path of the amended config (``guarded_config.json``); and logs
both runs in MLflow, in the task's experiment (the run directory's ``mlflow.db`` by default).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

from tuner.apply.config import PrecisionConfig
from tuner.errors import TaskError, UsageError
from tuner.records.mlflow_records import experiment_for
from tuner.records.mlflow_stores import default_tracking_uri

_EPOCH, _DONE = "PT-EPOCH ", "PT-DONE "   # tuner.worker.guarded_train's lines


def _start(task: Path, which: str, epochs: int) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen([sys.executable, "-m", "tuner.worker.guarded_train", str(task),
                             which, str(epochs)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _follow(name: str, process: subprocess.Popen, results: dict, lock: threading.Lock) -> None:
    for line in process.stdout:
        if line.startswith(_EPOCH):
            figures = json.loads(line[len(_EPOCH):])
            with lock:
                print(f"  {name:8s} epoch {figures['epoch']:3d}: val_loss "
                      f"{figures.get('val_loss', float('nan')):.5g}", flush=True)
        elif line.startswith(_DONE):
            results[name] = json.loads(line[len(_DONE):])


def train(task: Path, config_path: Path, epochs: int, against: str | None,
          run_dir: Path, tracking_uri: str | None = None) -> dict:
    if epochs < 1:
        raise UsageError(f"--epochs must be at least 1. Received: --epochs {epochs}")
    PrecisionConfig.load(config_path)  # refused here, in one line, before any process starts
    run_dir.mkdir(parents=True, exist_ok=True)
    runs = {"config": str(config_path.resolve())}
    if against == "float32":
        runs["float32"] = "float32"
    processes = {name: _start(task, which, epochs) for name, which in runs.items()}
    results: dict = {}
    lock = threading.Lock()
    readers = [threading.Thread(target=_follow, args=(name, process, results, lock))
               for name, process in processes.items()]
    for reader in readers:
        reader.start()
    for name, process in processes.items():
        errors = process.stderr.read()
        process.wait()
        if name not in results:
            last = (errors.strip().splitlines() or ["no output"])[-1]
            raise TaskError(f"the {name} training of {task.name} failed: {last}")
    for reader in readers:
        reader.join()
    record = _write(run_dir, task, config_path, epochs, results)
    _log_to_mlflow(record, results, tracking_uri or default_tracking_uri(run_dir), task.stem)
    return record


def _log_to_mlflow(record: dict, results: dict, tracking_uri: str, experiment: str) -> None:
    """Both runs in the task's experiment: per-epoch losses, the guard's events and the
    amended config (as the guard's own record in a user's MLflow run)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment_id = experiment_for(client, experiment, None)
    for name, result in results.items():
        run = client.create_run(experiment_id, run_name=f"train {name}",
                                tags={"precision_tuner.kind": "guarded_training",
                                      "precision_tuner.run": name,
                                      "precision_guard.events": str(len(result["events"]))})
        for key, values in result["history"].items():
            for epoch, value in enumerate(values):
                if math.isfinite(value):
                    client.log_metric(run.info.run_id, key, value, step=epoch + 1)
        client.log_dict(run.info.run_id, {"events": result["events"],
                                          "config": result["config"]}, "precision_guard.json")
        if name == "config" and "ratio" in record and math.isfinite(record["ratio"]):
            client.log_metric(run.info.run_id, "val_loss_ratio_vs_float32", record["ratio"])
        client.set_terminated(run.info.run_id)
    print(f"MLflow: experiment {experiment!r} at {tracking_uri}")


def _write(run_dir: Path, task: Path, config_path: Path, epochs: int, results: dict) -> dict:
    amended = PrecisionConfig.from_dict(results["config"]["config"])
    amended_path = amended.save(run_dir / "guarded_config.json", overwrite=True)
    record = {"task": str(task), "config": str(config_path), "epochs": epochs,
              "runs": {name: {"val_loss": result["history"].get("val_loss", []),
                              "loss": result["history"].get("loss", [])}
                       for name, result in results.items()},
              "events": results["config"]["events"], "amended_config": str(amended_path)}
    if "float32" in results:
        mine, base = (record["runs"][name]["val_loss"][-1] for name in ("config", "float32"))
        record["ratio"] = mine / base if base and math.isfinite(mine) else math.inf
    (run_dir / "train.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    _print_table(record)
    return record


def _print_table(record: dict) -> None:
    names = [name for name in ("config", "float32") if name in record["runs"]]
    print("\nepoch  " + "  ".join(f"{name + ' val_loss':>18s}" for name in names))
    length = len(record["runs"]["config"]["val_loss"])
    every = max(1, length // 10)
    for index in sorted(set(range(0, length, every)) | {length - 1}):
        print(f"{index + 1:5d}  " + "  ".join(
            f"{record['runs'][name]['val_loss'][index]:18.5g}" for name in names))
    for event in record["events"]:
        print(f"guard: epoch {event['epoch']} step {event['step']}: {event['kind']} "
              f"({event['layer'] or 'no layer'}): {event['action']}")
    if "ratio" in record:
        print(f"final validation loss: config / float32 = {record['ratio']:.3f}")
    print(f"amended config: {record['amended_config']}")
