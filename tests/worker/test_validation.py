"""The validation batches (tuner.worker.task.task_loader) and the evaluation on them
(tuner.worker.trial.validation): where they come from, that no trial trains on them, and what a
model that cannot be evaluated gives."""

import re

import keras
import numpy as np
import pytest

from tuner.worker.task.task_loader import VAL_BATCHES, fixed_batches, load_task, validation_batches
from tuner.worker.trial.validation import evaluate

MODEL = """
import keras, numpy as np
LOSS = "mse"
BATCH_SIZE = 16
def build_model():
    inputs = keras.Input(shape=(1,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))
"""


def _task(tmp_path, data: str, name="task"):
    path = tmp_path / f"{name}.py"
    path.write_text(MODEL + data)
    return load_task(str(path))


def _ids(batches):
    """The sample ids (x holds them) in a list of batches."""
    return {float(v) for batch in batches for v in np.asarray(batch[0]).ravel()}


def test_arrays_without_val_data_hold_back_a_fifth_spread_over_them(tmp_path):
    """Data sorted by class (the first half 0, the second 1): every training batch and the
    held-back fifth are a mix, drawn by one seeded permutation; no trial trains on a held-back
    sample; a second worker (the task loaded afresh) draws exactly the same; and
    ``precision-tuner train`` holds back exactly those rows too."""
    from tuner.worker.programs.one_training import _fit_data
    from tuner.worker.task import task_loader

    data = """
def train_data():
    x = np.arange(400, dtype="float32")[:, None]
    return x, (x >= 200).astype("float32")
"""
    task = _task(tmp_path, data)
    batches = fixed_batches(task, 50)
    held, source = validation_batches(task, 50)
    assert source == "held-back" and len(held) == VAL_BATCHES
    trained = _ids(batches)
    assert len(batches) == 320 // 16 and len(trained) == 320 and not trained & _ids(held)
    for batch in batches + held:   # each batch holds both classes
        assert set(np.asarray(batch[1]).ravel()) == {0.0, 1.0}
    assert max(_ids(held)) > 300 and min(_ids(held)) < 100   # spread, not the last rows

    task_loader.forget_tasks()
    again = _task(tmp_path, data)
    assert [np.asarray(b[0]).tolist() for b in fixed_batches(again, 50)] == \
        [np.asarray(b[0]).tolist() for b in batches]
    fit = _fit_data(again)
    held_rows = {float(v) for v in np.asarray(fit["validation_data"][0]).ravel()}
    assert held_rows >= _ids(held) and len(held_rows) == 80
    assert not held_rows & {float(v) for v in np.asarray(fit["x"]).ravel()}


def test_a_dataset_without_val_data_holds_back_the_batches_after_the_pool(tmp_path):
    task = _task(tmp_path, """
import tensorflow as tf
def train_data():
    x = np.arange(16 * 100, dtype="float32")[:, None]
    return tf.data.Dataset.from_tensor_slices((x, x)).batch(16)
""", "long")
    trained = _ids(fixed_batches(task, 50))
    held, source = validation_batches(task, 50)
    assert source == "held-back" and len(held) == VAL_BATCHES
    assert min(_ids(held)) == 16 * 50 and not trained & _ids(held)


def test_a_short_dataset_epoch_holds_back_its_last_fifth_and_cycles_the_rest(tmp_path):
    task = _task(tmp_path, """
import tensorflow as tf
def train_data():
    x = np.arange(16 * 10, dtype="float32")[:, None]
    return tf.data.Dataset.from_tensor_slices((x, x)).batch(16)
""", "short")
    trained = fixed_batches(task, 50)
    held, _ = validation_batches(task, 50)
    assert len(trained) == 50 and len(held) == 2            # 10 batches: 8 cycled, 2 held
    assert not _ids(trained) & _ids(held) and min(_ids(held)) == 16 * 8


def test_val_data_is_used_as_given_and_small_arrays_are_split_into_batches(tmp_path):
    task = _task(tmp_path, """
def train_data():
    x = np.arange(64, dtype="float32")[:, None]
    return x, x
def val_data():
    x = np.full((40, 1), -1.0, dtype="float32")
    return x, x
""", "with_val")
    assert len(fixed_batches(task, 50)) == 4              # all 64 samples train: 4 batches
    held, source = validation_batches(task, 50)
    assert source == "val_data" and _ids(held) == {-1.0}
    assert len(held) == VAL_BATCHES and all(len(batch[0]) == 5 for batch in held)


def test_evaluate_gives_per_batch_losses_and_metrics(tmp_path):
    task = _task(tmp_path, """
def train_data():
    x = np.arange(400, dtype="float32")[:, None] / 400
    return x, 2 * x
""", "fit")
    model = task.build_model()
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    held, source = validation_batches(task, 50)
    result = evaluate(model, held, source)
    assert len(result["batch_losses"]) == len(held) and result["metrics"].keys() == {"mae"}
    assert result["loss"] == pytest.approx(np.mean(result["batch_losses"]))
    assert len(set(result["batch_losses"])) > 1               # each batch's own loss
    # The first evaluate traces the test step in its first batch; a second one does not.
    assert 0 < result["trace_seconds"] < result["seconds"]
    assert evaluate(model, held, source)["trace_seconds"] == 0.0


def test_a_test_step_that_never_computes_the_loss_is_named_not_trusted(tmp_path):
    class Hidden(keras.Model):       # Keras's loss tracker hidden behind its own `metrics`
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)
            self.tracker = keras.metrics.Mean(name="loss")

        def call(self, x):
            return self.dense(x)

        @property
        def metrics(self):
            return [self.tracker]

    task = _task(tmp_path, """
def train_data():
    x = np.arange(400, dtype="float32")[:, None]
    return x, x
""", "hidden")
    model = Hidden()
    model.compile(optimizer="adam", loss="mse")
    result = evaluate(model, *validation_batches(task, 50))
    assert "does not compute it" in result["error"]


def test_nan_anywhere_in_the_arrays_is_refused_by_its_row(tmp_path):
    """Every row is checked before any is sampled (trials train on a sample, the user's
    training on all of them), a chunk at a time, and the first bad row is named."""
    from tuner.errors import TaskError
    from tuner.worker.task.array_rows import SCAN_ROWS

    rows = SCAN_ROWS + 100
    task = _task(tmp_path, f"""
def train_data():
    x = np.zeros(({rows}, 1), dtype="float32")
    x[{SCAN_ROWS + 7}, 0] = np.inf
    x[{rows - 1}, 0] = np.nan
    return x, x
""", "bad_rows")
    expected = f"has 2 NaN/inf value(s) in x (the first in row {SCAN_ROWS + 7})"
    with pytest.raises(TaskError, match=re.escape(expected)):
        fixed_batches(task, 4)
