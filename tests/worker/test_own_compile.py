"""Models that compile themselves (``compile_model(model, wrap_optimizer)``), trained in real
trials in this process: the Keras guide's GAN (examples/dcgan.py), a WGAN-GP whose gradient
penalty overflows float16, a model with two optimizers on two parts of one network, and the
guide's GAN with a hand-written cross-entropy. One float16 failure of each kind is caught and
named; the contract's mistakes are refused in one line."""

import dataclasses
import math
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT
from tuner.apply.config import Float32Placement, LossScale, PrecisionConfig
from tuner.errors import TaskError
from tuner.judging.verdict import Verdict, judge
from tuner.search.proposer import repair_for
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec
from tuner.worker.check.task_check import check_task
from tuner.worker.trial.trial import run_trial

RULES = dict(floor=1.0, max_skipped_fraction=0.2, min_loss_decrease_ratio=0.9)
DCGAN = str(ROOT / "examples" / "dcgan.py")
FLOAT16 = PrecisionConfig(policy="mixed_float16", loss_scale=LossScale(kind="dynamic"))
# What a dynamic scale from 2 ** 15 can read: halved on each overflow, down to the floor of 1.
DYNAMIC_SCALES = {2.0 ** k for k in range(16)}


def trial(path, config, steps=12, **extra):
    spec = TrialSpec(0, path, config.to_dict(), steps, 3, **extra)
    return TrialResult.from_dict(run_trial(spec.to_dict()))


def verdict(result, baseline, steps):
    return judge(result, baseline, expected_steps=steps, **RULES)


@pytest.fixture(scope="module")
def gan_float32():
    return trial(DCGAN, PrecisionConfig(), validate=True)


def test_the_guides_gan_trains_with_each_optimizer_scaled_and_each_loss_recorded(gan_float32):
    result = trial(DCGAN, FLOAT16, validate=True)
    assert result.outcome is TrialOutcome.COMPLETED, result.failure_message
    assert set(result.loss_terms) == {"d_loss", "g_loss"}
    assert all(len(values) == 12 for values in result.loss_terms.values())
    # The step's loss, for the rules that read one, is the sum of the two.
    assert result.losses[3] == pytest.approx(result.loss_terms["d_loss"][3]
                                             + result.loss_terms["g_loss"][3])
    # Both optimizers went through wrap_optimizer: each has the config's scale, and its own.
    assert [o["name"] for o in result.optimizers] == ["d_optimizer", "g_optimizer"]
    for record in result.optimizers:
        assert record["initial_loss_scale"] == 2.0 ** 15
        assert len(record["loss_scales"]) == 12
        assert set(record["loss_scales"]) <= DYNAMIC_SCALES, record["loss_scales"]
    assert result.loss_scales == [min(d, g) for d, g in zip(*(o["loss_scales"]
                                                              for o in result.optimizers))]
    # float32: the same optimizers, no scale; both judged; the sample-quality proxy taken.
    assert [o["loss_scales"][0] for o in gan_float32.optimizers] == [None, None]
    assert math.isfinite(gan_float32.validation["val_metric"])
    assert len(gan_float32.validation["val_metric_values"]) == 8   # one per batch of images
    assert "no call() and no test_step()" in gan_float32.validation["error"]
    # 12 steps of float16 keep float32's course; each loss is judged on its own: one that
    # goes astray makes the trial unstable, and the reason names it.
    judgement = verdict(result, gan_float32, 12)
    assert judgement.verdict is Verdict.STABLE, judgement.reason
    for name, values in result.loss_terms.items():
        astray = dataclasses.replace(result, loss_terms={**result.loss_terms,
                                                         name: [1.5 * v for v in values]})
        judgement = verdict(astray, gan_float32, 12)
        assert judgement.verdict is Verdict.UNSTABLE and judgement.reason.startswith(name), \
            judgement.reason


def test_the_diagnostics_trace_each_sub_model_through_the_train_step():
    info = check_task(DCGAN, steps=3, diagnose_steps=2)
    diagnostics = info["diagnostics"]
    assert "unavailable" not in diagnostics, diagnostics.get("unavailable")
    layers = {layer["layer"]: layer for layer in diagnostics["layers"]}
    # The discriminator on real and generated images, the generator on its latent batch.
    assert {"discriminator/conv2d", "discriminator/dense", "generator/dense_1",
            "generator/conv2d_2"} <= set(layers)
    assert layers["discriminator/conv2d"]["weight_gradient"]["abs_max"] > 0
    assert layers["generator/dense_1"]["weight_gradient"]["abs_max"] > 0
    assert diagnostics["gradient_abs_max"] > 0
    assert info["optimizer"] == {"class": "Adam, Adam", "epsilon": True}
    assert "discriminator/dense" in info["float32_matches"]["all_layers"]


def test_float32_placement_reaches_a_sub_models_layer_by_path():
    placed = PrecisionConfig(policy="mixed_bfloat16",
                             float32=Float32Placement(layers=("discriminator/dense",)))
    with placed.scope() as placer:
        from tuner.worker.task.task_loader import load_task

        model = load_task(DCGAN).build_model()
    policies = {layer.name: layer.dtype_policy.name for layer in model.discriminator.layers}
    assert policies["dense"] == "float32" and policies["conv2d"] == "mixed_bfloat16"
    assert placer.report()["layers"] == {"discriminator/dense": ["discriminator/dense"]}


def test_a_wgan_gp_whose_penalty_overflows_is_named_and_its_repair_tried(task_path):
    path = task_path("wgan_gp")
    baseline = trial(path, PrecisionConfig(), steps=8)
    assert baseline.outcome is TrialOutcome.COMPLETED
    assert all(map(math.isfinite, baseline.loss_terms["c_loss"]))
    result = trial(path, FLOAT16, steps=8)
    assert result.outcome is TrialOutcome.DIVERGED and result.first_non_finite_step == 0
    assert result.failure_layer == "gradient_penalty"
    judgement = verdict(result, baseline, 8)
    assert judgement.verdict is Verdict.UNSTABLE
    assert judgement.reason == ("c_loss non-finite at step 0 (first non-finite output: layer "
                                "gradient_penalty)")
    row = SimpleNamespace(config=FLOAT16, result=result, repair=False)
    repaired = repair_for(row)
    assert repaired.float32.layers == ("gradient_penalty",)
    # The penalty in float32: its norm is finite again.
    again = trial(path, repaired, steps=8)
    assert again.first_non_finite_step is None
    assert all(map(math.isfinite, again.loss_terms["c_loss"]))


def test_one_optimizers_collapsing_loss_scale_is_named(task_path):
    path = task_path("two_optimizers")
    baseline = trial(path, PrecisionConfig(), steps=16)
    result = trial(path, FLOAT16, steps=16)
    assert result.outcome is TrialOutcome.COMPLETED and result.loss_terms == {}
    body, head = result.optimizers
    assert body["name"] == "body_optimizer" and head["name"] == "head_optimizer"
    assert body["loss_scales"][-1] == 1.0 and set(range(11, 16)) <= set(body["skipped"])
    assert head["loss_scales"][-1] > 1.0
    judgement = verdict(result, baseline, 16)
    assert judgement.verdict is Verdict.UNSTABLE
    assert judgement.reason.startswith("body_optimizer: the loss scale collapsed")


def test_a_hand_written_cross_entropy_going_to_inf_is_named(task_path):
    path = task_path("dcgan_by_hand")
    baseline = trial(path, PrecisionConfig(), steps=50)
    assert all(map(math.isfinite, baseline.losses))
    result = trial(path, FLOAT16, steps=50)
    assert result.outcome is TrialOutcome.DIVERGED
    judgement = verdict(result, baseline, 50)
    step = result.first_non_finite_step
    names = [n for n, values in result.loss_terms.items() if not math.isfinite(values[step])]
    assert judgement.reason.startswith(f"{names[0]} non-finite at step {step} (")


@pytest.mark.parametrize("compile_model, expected", [
    ("    model.compile(d_optimizer=keras.optimizers.Adam(), g_optimizer=keras.optimizers.Adam(),"
     " loss_fn=keras.losses.BinaryCrossentropy())",
     "passed no optimizer through wrap_optimizer, so no config would reach the training"),
    ("    wrap_optimizer(keras.optimizers.Adam())",
     "did not compile the model. Call model.compile(...) in it"),
    ("    wrap_optimizer('adam')",
     "passed wrap_optimizer something that is not a Keras optimizer. Received: 'adam'"),
    ("    wrap_optimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))",
     "passed wrap_optimizer a LossScaleOptimizer. Pass the plain optimizer"),
    ("    raise ValueError('no such loss')",
     "compile_model(model, wrap_optimizer) in gan.py raised ValueError: no such loss"),
])
def test_compile_models_mistakes_are_refused_in_one_line(tmp_path, compile_model, expected):
    source = (ROOT / "examples" / "dcgan.py").read_text()
    head, _, _ = source.partition("def compile_model(model, wrap_optimizer):")
    rest = source.partition("def train_data():")[2]
    path = tmp_path / "gan.py"
    path.write_text(f"{head}def compile_model(model, wrap_optimizer):\n{compile_model}\n\n\n"
                    f"def train_data():{rest}")
    with pytest.raises(TaskError) as refused:
        check_task(str(path), steps=2)
    assert expected in str(refused.value) and "\n" not in str(refused.value)
    failed = trial(str(path), PrecisionConfig(), steps=2)
    assert failed.failure_class is FailureClass.TASK_ERROR and expected in failed.failure_message


def test_the_guard_watches_each_optimizer_a_model_trains_with():
    """A GAN's d_optimizer and g_optimizer each have a loss scale of their own: the guard
    watches both (their scales in its history) and leaves a healthy training alone."""
    import numpy as np

    from tuner.apply.config import LossScale
    from tuner.worker.task.task_loader import load_task
    from tuner.worker.task.task_model import compile_for_trial

    task = load_task(DCGAN)
    config = PrecisionConfig(policy="mixed_float16", loss_scale=LossScale("dynamic"))
    with config.scope():
        model = task.build_model()
    compile_for_trial(model, task, config)
    guard = config.guard()
    model.fit(np.zeros((32, 16, 16, 1), "float32"), epochs=1, verbose=0, callbacks=[guard])
    assert guard.events == []
    figures = guard.history[-1]
    assert figures["loss_scale_d_optimizer"] == float(model.d_optimizer.dynamic_scale.numpy())
    assert figures["loss_scale_g_optimizer"] == float(model.g_optimizer.dynamic_scale.numpy())
    assert figures["skipped_steps_d_optimizer"] == figures["skipped_steps_g_optimizer"] == 0
