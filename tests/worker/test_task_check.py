"""The task check reports what the search space is fitted to: the optimizer's epsilon."""

import pytest

from tuner.worker.check.task_check import check_task

TASK = """
import keras, numpy as np
LOSS = "mse"
def build_model():
    inputs = keras.Input(shape=(2,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))
def train_data():
    x = np.ones((64, 2), dtype="float32")
    return x, x[:, :1]
"""


@pytest.mark.parametrize("optimizer, has_epsilon", [("SGD(0.01)", False), ("Adam(1e-3)", True),
                                                    ("Lion(1e-4)", False)])
def test_the_task_check_says_whether_the_optimizer_has_an_epsilon(tmp_path, optimizer,
                                                                   has_epsilon):
    path = tmp_path / f"task_{has_epsilon}_{optimizer[:3]}.py"
    path.write_text(TASK + f"def make_optimizer():\n    return keras.optimizers.{optimizer}\n")
    info = check_task(str(path), steps=2)
    assert info["optimizer"] == {"class": optimizer.split("(")[0], "epsilon": has_epsilon}


# Data without labels, as ``model.fit(x)`` takes it: an autoencoder whose train_step computes
# its own loss (LOSS = None), fed a dataset of x alone or an array of x alone.
UNLABELLED = """
import keras, numpy as np, tensorflow as tf
LOSS = None
BATCH_SIZE = 16
X = np.random.default_rng(0).normal(size=(96, 4)).astype("float32")
class AutoEncoder(keras.Model):
    def __init__(self):
        super().__init__()
        self.code = keras.layers.Dense(2)
        self.back = keras.layers.Dense(4)
        self.tracker = keras.metrics.Mean(name="loss")
    def call(self, x):
        return self.back(self.code(x))
    def train_step(self, data):
        assert not isinstance(data, tuple), "fit hands a dataset of x the x itself"
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self(data) - data))
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply(grads, self.trainable_weights)
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}
def build_model():
    return AutoEncoder()
"""


@pytest.mark.parametrize("data", ["tf.data.Dataset.from_tensor_slices(X).batch(16)", "X"])
def test_data_without_labels_trains_and_the_diagnostics_say_why_they_are_not_taken(tmp_path,
                                                                                    data):
    from tuner.apply.config import PrecisionConfig
    from tuner.records.diagnostics_report import conclusions
    from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec
    from tuner.worker.task.task_loader import fixed_batches, load_task
    from tuner.worker.trial.trial import run_trial

    path = tmp_path / f"unlabelled_{'array' if data == 'X' else 'dataset'}.py"
    path.write_text(UNLABELLED + f"def train_data():\n    return {data}\n")
    batches = fixed_batches(load_task(str(path)), 3)
    assert [len(batch) for batch in batches] == [1, 1, 1]          # (x,): no y, no weights
    info = check_task(str(path), steps=3, diagnose_steps=2)
    assert info["style"] == "subclassed"
    assert info["diagnostics"]["unavailable"].startswith("the task's LOSS is None")
    assert conclusions(info["diagnostics"])[0].startswith("not taken: the task's LOSS is None")
    spec = TrialSpec(0, str(path), PrecisionConfig().to_dict(), 6, 2)
    result = TrialResult.from_dict(run_trial(spec.to_dict()))
    assert result.outcome is TrialOutcome.COMPLETED, result.failure_message
    assert len(result.losses) == 6


def test_diagnostics_that_fail_on_a_model_are_reported_not_raised(tmp_path, monkeypatch):
    from tuner.worker.diagnostics import diagnose

    def broken(*args, **kwargs):
        raise RuntimeError("an exotic model the diagnostics cannot trace\nsecond line")

    monkeypatch.setattr(diagnose, "diagnose_model", broken)
    path = tmp_path / "task_plain.py"
    path.write_text(TASK)
    info = check_task(str(path), steps=2, diagnose_steps=2)
    diagnostics = info["diagnostics"]
    assert diagnostics["unavailable"] == \
        "RuntimeError: an exotic model the diagnostics cannot trace"
    assert diagnostics["candidates"] == [] and diagnostics["loss_scale"]["initial_scale"] > 0


def test_a_diagnostics_failure_of_a_loss_none_task_is_reported_as_what_it_was(tmp_path,
                                                                             monkeypatch):
    """LOSS = None explains a failure to trace the loss, and only that: any other error is
    reported as itself (it was reported as "LOSS is None" whatever it was)."""
    from tuner.worker.diagnostics import diagnose

    path = tmp_path / "unlabelled.py"
    path.write_text(UNLABELLED + "def train_data():\n    return X\n")
    explained = check_task(str(path), steps=3, diagnose_steps=2)["diagnostics"]["unavailable"]
    assert explained.startswith("the task's LOSS is None (its train_step computes the loss), "
                                "so gradients cannot be traced outside it (ValueError: ")

    def broken(*args, **kwargs):
        raise RuntimeError("a layer the diagnostics cannot trace")

    monkeypatch.setattr(diagnose, "diagnose_model", broken)
    info = check_task(str(path), steps=3, diagnose_steps=2)
    assert info["diagnostics"]["unavailable"] == \
        "RuntimeError: a layer the diagnostics cannot trace"


def test_a_model_without_call_or_compile_model_is_refused_in_one_line_that_says_so(tmp_path):
    """The Keras guide's GAN has no call() (fit trains it through its train_step alone): without
    compile_model the task check says so and names the hook, not Keras's NotImplementedError
    with a hint about x."""
    from tuner.errors import TaskError

    path = tmp_path / "no_call.py"
    path.write_text('''
import keras, numpy as np
LOSS = None
class GAN(keras.Model):
    def __init__(self):
        super().__init__()
        self.generator = keras.Sequential([keras.layers.Dense(4)])
    def train_step(self, data):
        return {"loss": 0.0}
def build_model():
    return GAN()
def train_data():
    return np.ones((32, 4), dtype="float32")
''')
    with pytest.raises(TaskError) as refused:
        check_task(str(path), steps=2)
    message = str(refused.value)
    assert message.startswith("GAN from build_model() in no_call.py defines no call()")
    assert "Define compile_model(model, wrap_optimizer)" in message and "\n" not in message


def test_the_task_checks_facts_cross_the_process_boundary_as_one_type(task_path):
    """The worker sends the task check's facts as a dict (plain data between processes); the
    driver reads them as ``TaskFacts``: every name the worker writes is one the driver knows,
    a round trip changes nothing, and a name it does not know (a worker of another version)
    is refused, not silently dropped."""
    import dataclasses

    from tuner.task_facts import TaskFacts

    sent = check_task(task_path("tiny_mlp"), 4, ceiling=True, diagnose_steps=2)
    facts = TaskFacts.from_dict(sent)
    assert facts.to_dict() == sent
    assert set(sent) == {field.name for field in dataclasses.fields(TaskFacts)}
    assert facts.style == "functional" and facts.batches == 4 and facts.parameters > 0
    assert facts.ceiling is not None and facts.diagnostics is not None
    with pytest.raises(ValueError, match="unknown names \\['layers'\\]"):
        TaskFacts.from_dict({**sent, "layers": 3})
