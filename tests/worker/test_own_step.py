"""Tasks that hand the tuner a custom loop's step, ``train_step(model, optimizer, batch)``,
trained in real trials in this process: the step is what ``fit`` runs in every trial, each
optimizer of a dict wrapped with the trial's config and named after its key, each loss the step
returns recorded and judged; the contract's mistakes are refused in one line."""

import math

import keras
import pytest

from tests.conftest import ROOT, TASKS
from tests.worker.test_own_compile import FLOAT16, trial, verdict
from tuner.api.task_writer import LOSS_NOT_GIVEN
from tuner.apply.config import PrecisionConfig
from tuner.errors import TaskError
from tuner.judging.verdict import Verdict
from tuner.trial_types import TrialOutcome
from tuner.worker.check.task_check import check_task

pytestmark = pytest.mark.slow
LOOPS = TASKS / "loops"


def test_two_optimizers_of_a_loop_step_are_named_and_the_collapsing_one_is_judged():
    path = str(LOOPS / "two_speeds.py")
    baseline = trial(path, PrecisionConfig(), steps=16, validate=True)
    assert baseline.outcome is TrialOutcome.COMPLETED, baseline.failure_message
    assert math.isfinite(baseline.validation["loss"])   # LOSS given: validated on it
    result = trial(path, FLOAT16, steps=16)
    body, head = result.optimizers
    assert body["name"] == "body_optimizer" and head["name"] == "head_optimizer"
    assert body["initial_loss_scale"] == head["initial_loss_scale"] == 2.0**15
    assert body["loss_scales"][-1] == 1.0 and head["loss_scales"][-1] > 1.0
    judgement = verdict(result, baseline, 16)
    assert judgement.verdict is Verdict.UNSTABLE
    assert judgement.reason.startswith("body_optimizer: the loss scale collapsed")


def test_a_contrastive_step_without_labels_or_loss_trains_and_learns():
    result = trial(str(LOOPS / "contrastive.py"), PrecisionConfig(policy="mixed_bfloat16"),
                   steps=30)
    assert result.outcome is TrialOutcome.COMPLETED, result.failure_message
    assert len(result.losses) == 30 and all(map(math.isfinite, result.losses))
    assert sum(result.losses[-5:]) < 0.8 * sum(result.losses[:5])


def test_the_gan_loop_example_records_both_losses_and_both_scales():
    result = trial(str(ROOT / "examples" / "gan_loop.py"), FLOAT16, steps=12)
    assert result.outcome is TrialOutcome.COMPLETED, result.failure_message
    assert set(result.loss_terms) == {"d_loss", "g_loss"}
    assert [o["name"] for o in result.optimizers] == ["generator_optimizer",   # its dict's
                                                      "discriminator_optimizer"]  # order


@pytest.mark.parametrize("source, message", [
    ("def compile_model(model, wrap_optimizer):\n    pass\n",
     "defines both compile_model and train_step"),
    ("def make_optimizer():\n    return [keras.optimizers.Adam()]\n",
     r"make_optimizer\(\) must be a Keras optimizer or a dict of them by name"),
    ("train_step = 3\n", "train_step in .* must be a function"),
])
def test_a_loop_step_task_gone_wrong_is_refused_in_one_line(tmp_path, source, message):
    task = tmp_path / "task.py"
    task.write_text((LOOPS / "contrastive.py").read_text() + "\n" + source)
    with pytest.raises(TaskError, match=message) as raised:
        check_task(str(task), steps=4)
    assert "\n" not in str(raised.value)


def test_the_step_is_the_models_own_until_the_trial_installs_it():
    """The installed step is an attribute of that model alone: a model built again (the next
    trial's) trains with its class's train_step until installed."""
    from tuner.apply import own_step

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    own_step.install(model, lambda m, o, b: 0.0, keras.optimizers.Adam())
    assert own_step.installed(model) and "train_step" in vars(model)
    own_step.uninstall(model)
    assert not own_step.installed(model) and "train_step" not in vars(model)
    assert type(model).train_step is keras.Sequential.train_step


def test_tune_from_python_takes_a_train_step_without_a_loss(tmp_path):
    """``tuner.tune(train_step=..., optimizer=...)``: the step and a dict of optimizers written
    into the task file the workers load (no ``loss``: the step computes its own)."""
    import numpy as np
    import tensorflow as tf

    from tuner.api.task_writer import task_objects, write_task

    def build_model():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="body"),
                                 keras.layers.Dense(1, name="head")])

    def step(model, optimizer, batch):
        x, y = batch
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_mean(tf.square(tf.cast(model(x, training=True), "float32")
                                            - tf.reshape(y, (-1, 1))))
            scaled = {name: opt.scale_loss(loss) for name, opt in optimizer.items()}
        for name in ("body", "head"):
            weights = model.get_layer(name).trainable_weights
            optimizer[name].apply_gradients(zip(tape.gradient(scaled[name], weights), weights))
        return loss

    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    objects = task_objects(build_model, (x, x.sum(axis=1)), LOSS_NOT_GIVEN, train_step=step,
                           optimizer=lambda: {"body": keras.optimizers.SGD(1e-2),
                                              "head": keras.optimizers.Adam(1e-2)})
    path = write_task(tmp_path / "from_python.py", objects)
    result = trial(str(path), FLOAT16, steps=10)
    assert result.outcome is TrialOutcome.COMPLETED, result.failure_message
    assert [o["name"] for o in result.optimizers] == ["body_optimizer", "head_optimizer"]
    assert result.losses[-1] < result.losses[0]
