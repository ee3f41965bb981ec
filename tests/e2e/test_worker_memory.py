"""A tune whose worker runs short of memory, end to end on the local worker (tuner.run.kept_models):

- A float32 baseline that leaves no room for a 16-bit trial beside it (``--worker-memory``,
  the bound a shared device gives): the worker is replaced by a fresh one before the 16-bit
  trials, its resident memory measured before and after.
- The re-measurement's run of float32 in a fresh worker that never kept it: built again and
  timed.
- A fake allocator that fails a 16-bit trial with TensorFlow's out-of-memory error while the
  worker holds float32's model alive: the trial runs again in a fresh worker and is judged on
  that run.
"""

import json
import subprocess
import sys

from tests.conftest import ROOT
from tuner.apply.config import PrecisionConfig
from tuner.execution.local import LocalProcessExecutor
from tuner.trial_types import TrialOutcome, TrialSpec

# About 40 MB of weights (10M parameters): float32's training with Adam holds some 160 MB, and
# TensorFlow keeps that much of every model it trained in the process.
BIG = '''
import keras
import numpy as np

BATCH_SIZE = 16
LOSS = "mse"


def build_model():
    inputs = keras.Input(shape=(2048,))
    hidden = keras.layers.Dense(2048, activation="relu")(inputs)
    hidden = keras.layers.Dense(2048, activation="relu")(hidden)
    hidden = keras.layers.Dense(512, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 2048)).astype("float32")
    return x, x[:, :4].sum(axis=1, keepdims=True) * 0.25
'''

# The fake allocator: a layer whose training call fails as TensorFlow's allocator does, in a
# worker that holds a model alive (the float32 baseline's), as a GPU without room beside it.
FAKE_ALLOCATOR = '''
import keras
import numpy as np
import tensorflow as tf

BATCH_SIZE = 32
LOSS = "mse"


class Roomy(keras.layers.Layer):
    def call(self, inputs, training=None):
        from tuner.worker.trial.live_models import LIVE

        if training and LIVE and self.compute_dtype != "float32":
            raise tf.errors.ResourceExhaustedError(
                None, None, "OOM when allocating tensor with shape[32,256] and type half on "
                "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")
        return inputs


def build_model():
    inputs = keras.Input(shape=(32,))
    hidden = Roomy()(keras.layers.Dense(256, activation="relu")(inputs))
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 32)).astype("float32")
    return x, x[:, :1] * 0.5
'''


def _tune(tmp_path, task_text: str, *options: str):
    task = tmp_path / "task.py"
    task.write_text(task_text)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", str(task), "--space", "quick", "--trials", "3",
         "--keep-slow-policies", "--executor", "local", "--no-confirm", "--run-dir",
         str(run_dir), "--out", str(tmp_path / "best.json"), *options],
        capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    trials = [json.loads(line) for line in (run_dir / "trials.jsonl").read_text().splitlines()]
    return done.stdout + done.stderr, run, trials, run_dir


def test_float32s_model_goes_with_its_worker_where_no_16_bit_trial_fits_beside_it(tmp_path):
    output, run, trials, run_dir = _tune(tmp_path, BIG, "--worker-memory", "0.4")
    first = run["live_models"][0]
    assert first["released"] == [0] and first["fresh_worker"], first
    assert "before the 16-bit trials" in first["what"] and "--worker-memory" in first["why"]
    # float32's model showed in its worker's memory, and the fresh worker holds none of it.
    baseline = trials[0]["result"]
    held = baseline["device_room"]["held_bytes"]
    assert held > baseline["training_memory"]["total_bytes"] / 2, baseline["device_room"]
    assert first["rss_before"] - first["rss_after"] > 0.8 * held, (first, held)
    assert "a fresh worker for the next trial" in output
    # It went before any 16-bit trial: right after float32's, which runs alone and first.
    assert first["after_trial"] == 0 and trials[0]["config"]["policy"] == "float32"
    assert any(record["config"]["policy"] != "float32" for record in trials[1:])


def test_the_remeasurement_times_float32_in_a_fresh_worker_that_never_kept_it(tmp_path):
    task = tmp_path / "task.py"
    task.write_text(FAKE_ALLOCATOR)
    spec = TrialSpec(0, str(task), PrecisionConfig().to_dict(), 12, 2, keep_live=True)
    executor = LocalProcessExecutor(str(tmp_path / "worker.log"))
    try:
        assert executor.run(spec, 300).outcome is TrialOutcome.COMPLETED
        answer = executor.replace_worker()
        assert answer["replaced"] and answer["rss_after"] < answer["rss_before"], answer
        with executor.exclusive() as session:   # as the re-measurement times it
            timed = session.run(TrialSpec(0, str(task), PrecisionConfig().to_dict(), 12, 2),
                                300)
    finally:
        executor.close()
    assert timed.outcome is TrialOutcome.COMPLETED
    assert timed.trace_s > 0 and len(timed.timed_steps_ms) == 10   # built, traced, timed


def test_a_trial_out_of_memory_beside_float32s_model_runs_again_in_a_fresh_worker(tmp_path):
    output, run, trials, _ = _tune(tmp_path, FAKE_ALLOCATOR)
    sixteen = [r for r in trials if r["config"]["policy"] != "float32"]
    assert sixteen, trials
    first = sixteen[0]["result"]
    assert first["outcome"] == "completed", first.get("failure_message")
    (event, *_) = run["live_models"]
    assert event["released"] == [0] and "ran out of memory" in event["why"]
    assert f"#{sixteen[0]['number']} again" in event["what"] and event["fresh_worker"]
    assert "ran out of memory" in output
