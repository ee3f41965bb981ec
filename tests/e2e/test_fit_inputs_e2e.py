"""Data as users have it, tuned end to end to an exported config that loads: a task whose
``train_data()`` returns a ``keras.utils.PyDataset``, one returning an endless generator (both
through the command line), and a script that calls ``tuner.tune(train_data=...)`` with a
``tf.data.Dataset`` object, an endless one, and ``class_weight``."""

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT, TASKS
from tuner.apply.config import PrecisionConfig

pytestmark = pytest.mark.slow
QUICK = ("--space", "quick", "--trials", "2", "--steps", "12", "--confirm-seconds", "3")


@pytest.mark.parametrize("task", ["py_dataset", "endless_generator"])
def test_a_task_returning_a_source_of_batches_tunes_to_a_config(tmp_path, task):
    out = tmp_path / "best.json"
    done = subprocess.run([sys.executable, "-m", "tuner", "tune", str(TASKS / "inputs"
                                                                      / f"{task}.py"),
                           *QUICK, "--run-dir", str(tmp_path / "run"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert PrecisionConfig.load(out).policy in ("float32", "mixed_bfloat16", "mixed_float16")


SCRIPT = textwrap.dedent("""
    import json
    import sys
    from pathlib import Path

    import keras
    import numpy as np
    import tensorflow as tf

    import tuner

    def build_model():
        inputs = keras.Input(shape=(16,))
        x = keras.layers.Dense(32, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32 * 30, 16)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32")
    # an endless, shuffling pipeline, as training input pipelines are
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=0).batch(32).repeat()
    result = tuner.tune(build_model=build_model, train_data=data,
                        loss="sparse_categorical_crossentropy", class_weight={2: 3.0},
                        space="quick", trials=2, steps=12, confirm_seconds=3,
                        run_dir=Path(sys.argv[1]), executor="local")
    print(json.dumps({"config": str(Path(sys.argv[1]) / "best_precision.json")}))
""")


def test_tune_takes_a_dataset_object_and_class_weight_from_python(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    config = json.loads(done.stdout.strip().splitlines()[-1])["config"]
    assert PrecisionConfig.load(config).policy in ("float32", "mixed_bfloat16", "mixed_float16")
    task = next((tmp_path / "run.task").glob("*.py")).read_text()
    assert 'CLASS_WEIGHT = _TASK["CLASS_WEIGHT"]' in task
