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

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_train_against_float32_writes_the_verdict_events_and_amended_config(tmp_path):
    config = tmp_path / "f16.json"
    config.write_text('{"policy": "mixed_float16", "loss_scale": {"kind": "dynamic"}}')
    done = _cli("train", "examples/house_prices.py", "--config", str(config), "--epochs", "30",
                "--against", "float32", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "train.json").read_text())
    assert set(record["runs"]) == {"config", "float32"}
    assert all(len(run["val_loss"]) == 30 for run in record["runs"].values())
    mine, base = (record["runs"][name]["val_loss"][-3:] for name in ("config", "float32"))
    assert sum(mine) / sum(base) <= 1.25  # judged on the figures, not on the product's word
    assert record["verdict"]["measure"] == "val_loss" and record["verdict"]["worse"] is False
    assert any(event["layers"] == ["price"] for event in record["events"])
    amended = PrecisionConfig.load(record["amended_config"])
    assert "price" in amended.float32.layers
    assert "verdict: as good as float32" in done.stdout
    # Each training set its devices up before TensorFlow allocated (said by the child itself,
    # on its first line); on the CPU they ran side by side.
    assert "both trainings side by side on the CPU" in done.stdout
    for run in record["runs"].values():
        assert run["devices"]["before_tensorflow"] is True, run["devices"]
        assert run["devices"]["gpus"] == [] and run["devices"]["visible"] is None

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("house_prices")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.data.tags["precision_tuner.run"] for run in runs) == ["config", "float32"]
    for run in runs:
        assert len(client.get_metric_history(run.info.run_id, "val_loss")) == 30


def test_a_missing_config_is_one_line_and_exit_2(tmp_path):
    """Refused before the run directory is made (the one --run-dir names: without it the
    check looked where nothing could ever be written). The rule itself is tested fast in
    tests/run/test_guarded_training.py, which names the mutation it catches."""
    done = _cli("train", "examples/house_prices.py", "--config", str(tmp_path / "none.json"),
                "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "config file not found" in done.stderr
    assert not (tmp_path / "run").exists()


def test_an_unguarded_float16_training_that_ends_worse_exits_non_zero(tmp_path):
    config = tmp_path / "f16.json"
    config.write_text('{"policy": "mixed_float16", "loss_scale": {"kind": "dynamic"}}')
    done = _cli("train", "examples/house_prices.py", "--config", str(config), "--epochs", "30",
                "--against", "float32", "--no-guard", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "verdict: WORSE than float32" in done.stdout
    assert "trained without the guard" in done.stdout
    record = json.loads((tmp_path / "run" / "train.json").read_text())
    assert record["events"] == [] and record["guard"] is False
    mine, base = (record["runs"][name]["val_loss"][-1] for name in ("config", "float32"))
    assert not mine <= 1.25 * base  # worse on the figures themselves (inf, or stuck high)
    assert record["verdict"]["worse"] is True


UNLABELLED = """
import keras, numpy as np
BATCH_SIZE = 32
LOSS = None

class Reconstruct(keras.Model):
    def __init__(self):
        super().__init__()
        self.encode, self.decode = keras.layers.Dense(4), keras.layers.Dense(8)
    def call(self, x):
        out = self.decode(self.encode(x))
        self.add_loss(keras.ops.mean(keras.ops.square(out - keras.ops.cast(x, out.dtype))))
        return out

def build_model():
    return Reconstruct()

def train_data():
    return np.random.default_rng(0).normal(size=(512, 8)).astype("float32")
"""


def test_a_task_without_labels_or_validation_is_judged_on_its_training_loss(tmp_path):
    task, config = tmp_path / "unlabelled.py", tmp_path / "bf16.json"
    task.write_text(UNLABELLED)
    config.write_text('{"policy": "mixed_bfloat16"}')
    done = _cli("train", str(task), "--config", str(config), "--epochs", "3",
                "--against", "float32", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "on the training loss (the task has no validation data)" in done.stdout
    record = json.loads((tmp_path / "run" / "train.json").read_text())
    assert record["verdict"]["measure"] == "loss"
    assert len(record["runs"]["config"]["loss"]) == 3


def test_a_failing_config_run_stops_the_float32_run(tmp_path):
    """The model fails to build under the config's 16-bit policy only: the float32 run beside
    it would train all 200 epochs, and must be stopped instead."""
    task = tmp_path / "breaks.py"
    task.write_text(UNLABELLED.replace(
        "def build_model():\n    return Reconstruct()",
        "def build_model():\n"
        "    if keras.config.dtype_policy().name != 'float32':\n"
        "        raise RuntimeError('no model in 16 bits')\n"
        "    return Reconstruct()"))
    config = tmp_path / "bf16.json"
    config.write_text('{"policy": "mixed_bfloat16"}')
    done = _cli("train", str(task), "--config", str(config), "--epochs", "200",
                "--against", "float32", "--run-dir", str(tmp_path / "run"))
    assert done.returncode != 0
    assert "config training of breaks.py failed" in done.stderr
    assert "no model in 16 bits" in done.stderr and "float32 training was stopped" in done.stderr
    assert done.stderr.strip().count("\n") == 0
    epochs = [int(line.split("epoch")[1].split(":")[0]) for line in done.stdout.splitlines()
              if line.strip().startswith("float32") and "epoch" in line]
    assert not epochs or max(epochs) < 200, max(epochs)   # stopped, not trained to the end


def test_train_says_when_the_config_reaches_no_layer(tmp_path):
    task = tmp_path / "float32_layers.py"
    task.write_text(
        "import keras, numpy as np\nLOSS = 'mse'\n"
        "def build_model():\n"
        "    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, dtype='float32'),"
        " keras.layers.Dense(1, dtype='float32')])\n"
        "def train_data():\n"
        "    x = np.random.default_rng(0).normal(size=(256, 4)).astype('float32')\n"
        "    return x, x.sum(axis=1, keepdims=True)\n")
    config = tmp_path / "bf16.json"
    config.write_text('{"policy": "mixed_bfloat16"}')
    done = _cli("train", str(task), "--config", str(config), "--epochs", "2",
                "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "train.json").read_text())
    assert [event["kind"] for event in record["events"]] == ["precision_unreached"]
    line = next(text for text in done.stdout.splitlines()
                if text.startswith("guard: mixed_bfloat16 reached 0%"))
    assert "dense" in line and "dtype='float32' in the code" in line and "Fix:" in line


def _fake_gpus(tmp_path, count: int) -> dict:
    """An environment whose ``nvidia-smi -L`` lists ``count`` GPUs (TensorFlow still trains on
    the CPU: what is checked is where the trainings were sent)."""
    import os

    from tests.support.fake_nvidia_smi import fake_nvidia_smi

    bin_dir = fake_nvidia_smi(tmp_path / "bin", count, name="NVIDIA L4")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@pytest.mark.parametrize("gpus", [1, 2])
def test_against_float32_on_one_gpu_runs_one_after_the_other_and_on_two_a_gpu_each(tmp_path,
                                                                                  gpus):
    config = tmp_path / "bf16.json"
    config.write_text('{"policy": "mixed_bfloat16"}')
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "train", "examples/house_prices.py", "--config",
         str(config), "--epochs", "3", "--against", "float32", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, cwd=ROOT, timeout=600, env=_fake_gpus(tmp_path, gpus))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "train.json").read_text())
    visible = {name: run["devices"]["visible"] for name, run in record["runs"].items()}
    epochs = [line.split()[0] for line in done.stdout.splitlines() if " epoch " in line]
    if gpus == 1:
        assert "one GPU: the float32 training runs after the config one" in done.stdout
        assert epochs == ["config"] * 3 + ["float32"] * 3   # the second began after the first
        assert visible == {"config": None, "float32": None}
    else:
        assert "side by side, a GPU each: config on 0, float32 on 1" in done.stdout
        assert visible == {"config": "0", "float32": "1"}
    assert all(run["devices"]["before_tensorflow"] for run in record["runs"].values())
