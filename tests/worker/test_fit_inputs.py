"""What a task's data may be: what ``model.fit(x=...)`` takes (tuner.worker.task.fit_inputs).
A PyDataset, an endless generator, a tf.data pipeline reading TFRecord files into a dict of
named features, and arrays with ``CLASS_WEIGHT`` all become the fixed batches every trial
trains on; class weights weigh the training batches as ``fit`` does (the same loss and the same
weights after a step), never the validation; what ``fit`` refuses is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import TASKS
from tuner.errors import TaskError
from tuner.worker.task import task_loader
from tuner.worker.task.task_loader import fixed_batches, load_task, validation_batches

INPUTS = TASKS / "inputs"


@pytest.fixture(autouse=True)
def _fresh():
    task_loader.forget_tasks()
    yield
    task_loader.forget_tasks()


@pytest.mark.parametrize("name, x_shape, source", [
    ("py_dataset", (32, 16), "val_data"),
    ("endless_generator", (32, 8), "held-back"),
    ("tfrecord_features", {"age": (16, 4), "scan": (16, 6)}, "val_data"),
])
def test_every_source_of_batches_fit_takes_becomes_the_trials_batches(name, x_shape, source):
    task = load_task(str(INPUTS / f"{name}.py"))
    batches = fixed_batches(task, 60)          # more than some of these hold: cycled
    assert len(batches) == 60
    x = batches[0][0]
    shapes = {key: tuple(value.shape) for key, value in x.items()} if isinstance(x, dict) \
        else tuple(x.shape)
    assert shapes == x_shape
    held, where = validation_batches(task, 60)
    assert where == source and len(held) >= 2
    assert all(len(batch) == 2 for batch in held)          # validation is never weighted
    # the same data for every trial: a second read gives the same batches
    assert np.array_equal(np.asarray(fixed_batches(task, 60)[5][1]), np.asarray(batches[5][1]))


def test_an_endless_generator_is_read_only_as_far_as_needed():
    task = load_task(str(INPUTS / "endless_generator.py"))
    batches = fixed_batches(task, 12)
    held, _ = validation_batches(task, 12)
    # distinct batches all along (nothing cycled), and held back after the trials' own
    assert len({np.asarray(b[0]).tobytes() for b in batches + held}) == len(batches) + len(held)


def test_class_weight_weighs_the_training_batches_as_fit_does():
    import keras

    task = load_task(str(INPUTS / "tfrecord_features.py"))
    batches = fixed_batches(task, 4)
    for x, y, weights in batches:
        labels = np.asarray(y).reshape(-1)
        assert np.array_equal(np.asarray(weights), np.where(labels == 1, 4.0, 1.0))
    x, y, weights = batches[0]
    numpy_x = {key: np.asarray(value) for key, value in x.items()}

    def one_step(**how):
        keras.utils.set_random_seed(3)
        model = task.build_model()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=task.loss)
        history = model.fit(numpy_x, np.asarray(y), batch_size=len(np.asarray(y)), epochs=1,
                            shuffle=False, verbose=0, **how)
        return history.history["loss"][0], model.get_weights()

    by_fit, weights_fit = one_step(class_weight=task.class_weight)
    by_us, weights_us = one_step(sample_weight=np.asarray(weights))
    assert by_fit == pytest.approx(by_us, rel=1e-6)
    assert all(np.allclose(a, b) for a, b in zip(weights_fit, weights_us))


def _task(tmp_path, body: str):
    path = tmp_path / "task.py"
    path.write_text("import keras\nimport numpy as np\nLOSS = 'mse'\n"
                    "def build_model():\n"
                    "    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])\n"
                    + body)
    return load_task(str(path))


@pytest.mark.parametrize("body, message", [
    ("def train_data():\n    return 'data.csv'\n",
     "train_data() in task.py must return what model.fit(x=...) takes: arrays"),
    ("def train_data():\n    return 3\n", "a keras.utils.PyDataset, or a generator of batches"),
    ("def train_data():\n    return {'x': [1, 2, 3]}\n",
     "returned numbers where arrays with one row per sample belong"),
    ("CLASS_WEIGHT = {0: 1.0}\ndef train_data():\n"
     "    x = np.zeros((64, 4), 'float32')\n    return x, np.zeros(64), np.ones(64)\n",
     "the data has sample weights of its own; model.fit takes class_weight or sample weights"),
    ("CLASS_WEIGHT = {0: 1.0}\ndef train_data():\n    return np.zeros((64, 4), 'float32')\n",
     "weighs samples by their labels, but the data has none"),
    ("CLASS_WEIGHT = [1.0, 2.0]\ndef train_data():\n    return np.zeros((64, 4), 'float32')\n",
     "CLASS_WEIGHT in task.py must map class indices to weights"),
])
def test_what_fit_would_refuse_is_refused_in_one_line(tmp_path, body, message):
    with pytest.raises(TaskError) as refused:
        fixed_batches(_task(tmp_path, body), 4)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_dict_of_arrays_alone_is_x_as_fit_takes_it(tmp_path):
    task = _task(tmp_path, "def train_data():\n"
                           "    return {'a': np.ones((64, 4), 'float32')}\n")
    batches = fixed_batches(task, 2)
    assert len(batches[0]) == 1 and tuple(batches[0][0]["a"].shape) == (32, 4)
