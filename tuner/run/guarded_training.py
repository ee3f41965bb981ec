"""``precision-tuner train``: a task's whole training under a config with the precision guard
(``guard=False``: unguarded, to see what the guard saved), and with ``against="float32"`` the
same training in float32 (two processes, side by side on the CPU or a GPU each, one after the
other on a single GPU: ``placement``; the figures compared are losses, not times; when one
fails the other is stopped). Each process sets up its devices before TensorFlow allocates and
says how (``devices`` in train.json). Shows each epoch's losses as they arrive, then a
table and a verdict: the config's loss over float32's, on validation (on the training loss
where the task has no validation, said so), over the last epochs, within the confirmation's
allowance (``LEVEL_ALLOWANCE``) or worse, and ``worse`` in the record, which the command turns
into a non-zero exit. Writes ``train.json`` in the run directory: each run's per-epoch
``val_loss`` and ``loss``, the final ``ratio``, the ``verdict``, the guard's ``events`` and the
path of the amended config (``guarded_config.json``); and logs both runs in MLflow, in the
task's experiment (the run directory's ``mlflow.db`` by default).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tuner.apply.config import PrecisionConfig
from tuner.apply.guard.mlflow_record import ARTIFACT, EVENTS_TAG, guard_record
from tuner.errors import TaskError, UsageError
from tuner.execution.gpus import visible_gpu_ids
from tuner.judging.learning import LEVEL_ALLOWANCE
from tuner.process_lines import DEVICES, DONE, EPOCH, read_line
from tuner.records.mlflow_records import experiment_for
from tuner.records.mlflow_stores import default_tracking_uri

_LAST_EPOCHS = 3   # the verdict compares the mean of each run's last epochs (one epoch is noisy)


def _start(task: Path, which: str, epochs: int, guard: bool,
           device: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if device is not None:   # a GPU (or MIG slice) of its own
        env["CUDA_VISIBLE_DEVICES"] = device
    return subprocess.Popen([sys.executable, "-m", "tuner.worker.programs.one_training",
                             str(task), which, str(epochs)] + ([] if guard else ["--no-guard"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def placement(names: list[str], gpus: list[str]) -> tuple[list[list[str]], dict[str, str], str]:
    """How the trainings ``names`` share this machine's ``gpus`` (tuner.execution.gpus):
    ``(waves, devices, line)``: the runs started together, wave after wave; each run's GPU
    where it gets one of its own; and what to say. On the CPU, side by side (the figures
    compared are losses, not times). On one GPU, one after the other: side by side, each
    TensorFlow process would have about half of its memory, and a model that needs more than
    that fails in one of them. On several, side by side, a GPU each."""
    if len(names) < 2:
        return [names], {}, ""
    if not gpus:
        return [names], {}, "both trainings side by side on the CPU"
    if len(gpus) == 1:
        return [[name] for name in names], {}, (
            f"one GPU: the {names[1]} training runs after the {names[0]} one (side by side, "
            "each would have about half of its memory)")
    devices = dict(zip(names, gpus))
    return [names], devices, "side by side, a GPU each: " + ", ".join(
        f"{name} on {device}" for name, device in devices.items())


def _follow(name: str, process: subprocess.Popen, results: dict, lock: threading.Lock) -> None:
    devices = None
    for line in process.stdout:   # tuner.worker.programs.one_training's lines
        kind, data = read_line(line)
        if kind == DEVICES:   # its first line: how it set up its devices
            devices = data
        elif kind == EPOCH:
            key = "val_loss" if "val_loss" in data else "loss"
            with lock:
                print(f"  {name:8s} epoch {data['epoch']:3d}: {key} "
                      f"{data.get(key, float('nan')):.5g}", flush=True)
        elif kind == DONE:
            results[name] = {**data, "devices": devices}


def train(task: Path, config_path: Path, epochs: int, against: str | None,
          run_dir: Path, tracking_uri: str | None = None, guard: bool = True) -> dict:
    if epochs < 1:
        raise UsageError(f"--epochs must be at least 1. Received: --epochs {epochs}")
    PrecisionConfig.load(config_path)  # refused here, in one line, before any process starts
    run_dir.mkdir(parents=True, exist_ok=True)
    runs = {"config": str(config_path.resolve())}
    if against == "float32":
        runs["float32"] = "float32"
    waves, devices, said = placement(list(runs), visible_gpu_ids())
    if said:
        print(said, flush=True)
    results: dict = {}
    for wave in waves:
        _run_wave(task, {name: runs[name] for name in wave}, epochs, guard, devices, results)
    record = _write(run_dir, task, config_path, epochs, results, guard)
    _log_to_mlflow(record, results, tracking_uri or default_tracking_uri(run_dir), task.stem)
    return record


def _run_wave(task: Path, runs: dict[str, str], epochs: int, guard: bool,
              devices: dict[str, str], results: dict) -> None:
    """Start ``runs`` together and follow them to the end; the first to fail stops the rest
    and raises, in one line."""
    processes = {name: _start(task, which, epochs, guard, devices.get(name))
                 for name, which in runs.items()}
    lock = threading.Lock()
    readers = [threading.Thread(target=_follow, args=(name, process, results, lock))
               for name, process in processes.items()]
    for reader in readers:
        reader.start()
    errors: dict[str, list[str]] = {name: [] for name in processes}
    drains = [threading.Thread(target=lambda n=name, p=process: errors[n].extend(p.stderr))
              for name, process in processes.items()]
    for drain in drains:
        drain.start()
    failed = _wait_all(processes, results)
    for thread in readers + drains:
        thread.join()
    if failed is not None:
        last = ([line for line in "".join(errors[failed]).splitlines() if line.strip()]
                or ["no output"])[-1]
        stopped = [name for name in processes if name != failed]
        also = f" (the {stopped[0]} training was stopped)" if stopped else ""
        raise TaskError(f"the {failed} training of {task.name} failed: {last}{also}")


def _wait_all(processes: dict[str, subprocess.Popen], results: dict) -> str | None:
    """Wait for every run; the first that ends without its result stops the others (a
    float32 run left going would cost the rest of its training for nothing). Returns the
    name of the run that failed, or None."""
    waiting = dict(processes)
    while waiting:
        for name, process in list(waiting.items()):
            if process.poll() is None:
                continue
            del waiting[name]
            if process.returncode != 0:
                for other in waiting.values():
                    other.kill()
                for other in waiting.values():
                    other.wait()
                return name
        time.sleep(0.2)
    return None


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
                                      EVENTS_TAG: str(len(result["events"]))})
        for key, values in result["history"].items():
            for epoch, value in enumerate(values):
                if math.isfinite(value):
                    client.log_metric(run.info.run_id, key, value, step=epoch + 1)
        client.log_dict(run.info.run_id, guard_record(result["events"], result["config"]), ARTIFACT)
        if name == "config" and "ratio" in record and math.isfinite(record["ratio"]):
            measure = record["verdict"]["measure"]  # val_loss, or loss without validation
            client.log_metric(run.info.run_id, f"{measure}_ratio_vs_float32", record["ratio"])
        client.set_terminated(run.info.run_id)
    print(f"MLflow: experiment {experiment!r} at {tracking_uri}")


def _write(run_dir: Path, task: Path, config_path: Path, epochs: int, results: dict,
           guard: bool = True) -> dict:
    amended = PrecisionConfig.from_dict(results["config"]["config"])
    amended_path = amended.save(run_dir / "guarded_config.json", overwrite=True)
    record = {"task": str(task), "config": str(config_path), "epochs": epochs, "guard": guard,
              "runs": {name: {"val_loss": result["history"].get("val_loss", []),
                              "loss": result["history"].get("loss", []),
                              "devices": result.get("devices")}
                       for name, result in results.items()},
              "events": results["config"]["events"], "amended_config": str(amended_path)}
    if "float32" in results:
        record["verdict"] = verdict(record["runs"]["config"], record["runs"]["float32"])
        record["ratio"] = record["verdict"]["final_ratio"]
    (run_dir / "train.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    _print_table(record)
    return record


def verdict(mine: dict[str, list[float]], base: dict[str, list[float]]) -> dict:
    """The config's run against float32's: on validation loss where both have it, else on the
    training loss; the ratio of the means of the last epochs, worse beyond the allowance."""
    measure = "val_loss" if mine["val_loss"] and base["val_loss"] else "loss"
    ours, theirs = mine[measure], base[measure]
    if not ours or not theirs:
        return {"measure": measure, "ratio": math.inf, "final_ratio": math.inf,
                "allowance": LEVEL_ALLOWANCE, "worse": True}
    tail = min(_LAST_EPOCHS, len(ours), len(theirs))
    ratio = _ratio(sum(ours[-tail:]) / tail, sum(theirs[-tail:]) / tail)
    return {"measure": measure, "epochs_compared": tail, "ratio": ratio,
            "final_ratio": _ratio(ours[-1], theirs[-1]), "allowance": LEVEL_ALLOWANCE,
            "worse": not ratio <= 1 + LEVEL_ALLOWANCE}


def _ratio(mine: float, base: float) -> float:
    if not math.isfinite(mine):
        return math.inf
    return mine / base if base > 0 else (1.0 if mine <= base else math.inf)


def _print_table(record: dict) -> None:
    names = [name for name in ("config", "float32") if name in record["runs"]]
    measure = record.get("verdict", {}).get("measure") or (
        "val_loss" if record["runs"]["config"]["val_loss"] else "loss")
    print("\nepoch  " + "  ".join(f"{name + ' ' + measure:>18s}" for name in names))
    length = len(record["runs"]["config"][measure])
    every = max(1, length // 10)
    for index in sorted(set(range(0, length, every)) | {length - 1}):
        print(f"{index + 1:5d}  " + "  ".join(
            f"{record['runs'][name][measure][index]:18.5g}" for name in names))
    for event in record["events"]:
        if event["kind"] == "precision_unreached":   # the line itself names layers and fix
            print(f"guard: {event['seen']}")
            continue
        print(f"guard: epoch {event['epoch']} step {event['step']}: {event['kind']} "
              f"({', '.join(event['layers']) or 'no layer'}): {event['action']}")
    if not record.get("guard", True):
        print("trained without the guard (--no-guard)")
    if "verdict" in record:
        judged = record["verdict"]
        print(verdict_line(judged))
    print(f"amended config: {record['amended_config']}")


def verdict_line(judged: dict) -> str:
    what = ("validation loss" if judged["measure"] == "val_loss"
            else "training loss (the task has no validation data)")
    figure = f"config / float32 = {judged['ratio']:.3f} on the {what}"
    if "epochs_compared" in judged:
        figure += f", mean of the last {judged['epochs_compared']} epochs"
    bar = 1 + judged["allowance"]
    if judged["worse"]:
        return (f"verdict: WORSE than float32: {figure}, beyond the allowed {bar:.2f}. Do not "
                "train under this config as it is: use the amended config, or float32.")
    return f"verdict: as good as float32: {figure}, within the allowed {bar:.2f}"
