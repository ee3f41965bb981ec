"""``precision-tuner train TASK --config FILE --against float32``: the whole training under the
config with the guard, float32 beside it, train.json, the amended config, and both runs in
MLflow, from the command line as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuner import PrecisionConfig

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_train_against_float32_writes_the_ratio_events_and_amended_config(tmp_path):
    config = tmp_path / "f16.json"
    config.write_text('{"policy": "mixed_float16", "loss_scale": {"kind": "dynamic"}}')
    done = _cli("train", "examples/house_prices.py", "--config", str(config), "--epochs", "6",
                "--against", "float32", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "train.json").read_text())
    assert set(record["runs"]) == {"config", "float32"}
    assert all(len(run["val_loss"]) == 6 for run in record["runs"].values())
    assert record["ratio"] == pytest.approx(record["runs"]["config"]["val_loss"][-1]
                                            / record["runs"]["float32"]["val_loss"][-1])
    assert any(event["layer"] == "price" for event in record["events"])
    amended = PrecisionConfig.load(record["amended_config"])
    assert "price" in amended.float32.layers
    assert "final validation loss: config / float32" in done.stdout

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("house_prices")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.data.tags["precision_tuner.run"] for run in runs) == ["config", "float32"]
    for run in runs:
        assert len(client.get_metric_history(run.info.run_id, "val_loss")) == 6


def test_a_missing_config_is_one_line_and_exit_2(tmp_path):
    done = _cli("train", "examples/house_prices.py", "--config", str(tmp_path / "none.json"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "config file not found" in done.stderr
    assert not (tmp_path / "run").exists()
