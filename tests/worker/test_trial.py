"""Real trials in this process: recording, failure classes, the underflow case."""

import math
from pathlib import Path

import pytest

from tuner.apply.config import Float32Placement, LossScale, PrecisionConfig
from tuner.errors import TaskError
from tuner.judging.verdict import Verdict, judge
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec
from tuner.worker.check.task_check import check_task
from tuner.worker.trial.trial import run_trial

RULES = dict(floor=1.0, max_skipped_fraction=0.2, min_loss_decrease_ratio=0.9)


def trial(path, config, steps=16, **extra):
    spec = TrialSpec(0, path, config.to_dict(), steps, 3, **extra)
    return TrialResult.from_dict(run_trial(spec.to_dict()))


def test_float32_trial_records_every_step(task_path):
    result = trial(task_path("tiny_mlp"), PrecisionConfig())
    assert result.outcome is TrialOutcome.COMPLETED
    assert len(result.losses) == len(result.step_times_ms) == len(result.loss_scales) == 16
    assert all(math.isfinite(v) for v in result.losses)
    assert result.losses[-1] < result.losses[0]
    assert result.median_step_ms > 0 and result.batch_size == 32
    assert result.weights_bytes == (16 * 32 + 32 + 32 * 2 + 32 * 3 + 3) * 4
    assert result.setup_s > 0 and result.train_s > 0
    # The first step (tracing) is counted apart from the training steps that follow it.
    assert result.trace_s == pytest.approx(result.step_times_ms[0] / 1000)
    assert result.train_s == pytest.approx(sum(result.step_times_ms[1:]) / 1000)
    assert result.wall_s >= result.setup_s + result.trace_s + result.train_s
    # What the process used (tuner.worker.trial.memory.MemoryMeter): a CPU's RSS growth here.
    assert result.memory_source == "host_rss_growth"
    assert isinstance(result.peak_memory_bytes, int) and result.peak_memory_bytes >= 0
    assert result.training_memory["total_bytes"] > 0 and result.memory_error == ""


def test_a_memory_count_that_fails_says_why(task_path, monkeypatch):
    from tuner.worker.trial import trial as worker_trial

    def broken(model, optimizer, x):
        raise TypeError("an eager call of the model raised")

    monkeypatch.setattr(worker_trial, "training_memory", broken)
    result = trial(task_path("tiny_mlp"), PrecisionConfig(), steps=6)
    assert result.outcome is TrialOutcome.COMPLETED and result.training_memory is None
    assert result.memory_error == "TypeError: an eager call of the model raised"


@pytest.mark.slow   # the quick tier keeps its five minutes on a 2-core CPU
def test_same_seed_same_losses(task_path):
    first = trial(task_path("tiny_mlp"), PrecisionConfig(), steps=8)
    second = trial(task_path("tiny_mlp"), PrecisionConfig(), steps=8)
    assert first.losses == second.losses


@pytest.mark.slow   # several trainings: the quick tier keeps its five minutes
def test_pure_bfloat16_halves_weight_memory(task_path):
    full = trial(task_path("tiny_mlp"), PrecisionConfig(), steps=6)
    half = trial(task_path("tiny_mlp"), PrecisionConfig("bfloat16"), steps=6)
    assert half.weights_bytes * 2 == full.weights_bytes


@pytest.mark.slow   # several trainings: the quick tier keeps its five minutes
def test_underflowing_gradients_need_a_loss_scale(task_path):
    path = task_path("underflow")
    baseline = trial(path, PrecisionConfig(), steps=20)
    unscaled = trial(path, PrecisionConfig("mixed_float16"), steps=20)
    scaled = trial(path, PrecisionConfig("mixed_float16", LossScale("dynamic")), steps=20)
    unscaled_verdict = judge(unscaled, baseline, expected_steps=20, **RULES)
    scaled_verdict = judge(scaled, baseline, expected_steps=20, **RULES)
    assert unscaled_verdict.verdict is Verdict.UNSTABLE, unscaled_verdict
    assert "of float32's loss decrease" in unscaled_verdict.reason
    assert scaled_verdict.verdict is Verdict.STABLE, scaled_verdict
    assert scaled.loss_scales[0] == 2.0**15


def test_dtype_mismatch_names_the_layer_and_the_fix(task_path):
    result = trial(task_path("dtype_clash"), PrecisionConfig("mixed_float16"))
    assert result.outcome is TrialOutcome.FAILED
    assert result.failure_class is FailureClass.DTYPE_MISMATCH
    assert result.failure_layer == "bias_shift"
    assert "keep bias_shift in float32" in result.failure_message
    fixed = trial(task_path("dtype_clash"),
                  PrecisionConfig("mixed_float16",
                                  float32=Float32Placement(layers=("bias_shift",))))
    assert fixed.outcome is TrialOutcome.COMPLETED


@pytest.mark.slow   # the quick tier keeps its five minutes on a 2-core CPU
def test_subclassed_model_with_own_train_step_and_dataset(task_path):
    cfg = PrecisionConfig("mixed_float16", LossScale("dynamic"),
                          float32=Float32Placement(("softmax",)))
    result = trial(task_path("subclassed"), cfg)
    assert result.outcome is TrialOutcome.COMPLETED, result.failure_message
    assert result.loss_scales[-1] == 2.0**15
    assert result.losses[-1] < result.losses[0]


def test_task_errors_become_failed_trials(task_path):
    broken = trial(task_path("broken_build"), PrecisionConfig())
    assert broken.failure_class is FailureClass.TASK_ERROR
    assert "oops: this model cannot be built" in broken.failure_message
    bad = trial(task_path("bad_data"), PrecisionConfig())
    assert bad.failure_class is FailureClass.TASK_ERROR
    assert "must return what model.fit(x=...) takes" in bad.failure_message


@pytest.mark.slow   # the quick tier keeps its five minutes on a 2-core CPU
def test_slow_trials_stop_early(task_path):
    result = trial(task_path("tiny_mlp"), PrecisionConfig(), stop_if_slower_than_ms=1e-6)
    assert result.outcome is TrialOutcome.STOPPED_SLOW
    assert len(result.losses) < 16 and "stopped" in result.stop_reason


def test_probe_describes_the_task_and_refuses_bad_ones(task_path):
    info = check_task(task_path("subclassed"), 10)
    assert info["style"] == "subclassed" and info["batch_size"] == 32
    with pytest.raises(TaskError, match="must return what model.fit"):
        check_task(task_path("bad_data"), 10)
    with pytest.raises(TaskError, match="build_model\\(\\) in broken_build.py raised"):
        check_task(task_path("broken_build"), 10)


# -- trials run what fit runs ---------------------------------------------------------------------
ZOO = Path(__file__).parent.parent / "suites" / "zoo"


def test_batches_keep_the_structure_of_the_data(tmp_path):
    import numpy as np
    import tensorflow as tf

    from tuner.worker.task.task_loader import Task, fixed_batches

    x, y = np.ones((64, 3), "float32"), np.zeros(64, "int32")
    weights = np.ones(64, "float32")
    datasets = {"pair": lambda: (x, y), "triple": lambda: (x, y, weights),
                "no_weights": lambda: (x, y, None),
                "dataset_pair": lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(16),
                "dataset_triple": lambda: tf.data.Dataset.from_tensor_slices(
                    (x, y, weights)).batch(16)}
    lengths = {}
    for name, data in datasets.items():
        task = Task(tmp_path / f"{name}.py", None, None, data, "mse", None, 16, None)
        batches = fixed_batches(task, 3)
        lengths[name] = {len(batch) for batch in batches}
    assert lengths == {"pair": {2}, "triple": {3}, "no_weights": {2}, "dataset_pair": {2},
                       "dataset_triple": {3}}


@pytest.mark.slow   # the quick tier keeps its five minutes on a 2-core CPU
def test_a_guide_style_train_step_gets_what_fit_gives_it():
    # `x, y = data` fails on the (x, y, sample_weight) that train_on_batch hands over.
    for name in ("guide_train_step", "sample_weights"):
        result = trial(str(ZOO / f"{name}.py"), PrecisionConfig(), steps=4)
        assert result.outcome is TrialOutcome.COMPLETED, (name, result.failure_message)


@pytest.mark.slow   # the quick tier keeps its five minutes on a 2-core CPU
def test_each_step_records_its_own_loss_not_a_running_mean(task_path):
    from tuner.worker.task.keras_state import reset_keras_state
    from tuner.worker.task.task_loader import fixed_batches, load_task

    result = trial(task_path("tiny_mlp"), PrecisionConfig(), steps=6)
    reset_keras_state(0)  # replay, one step at a time, each loss its own
    task = load_task(task_path("tiny_mlp"))
    model = task.build_model()
    model.compile(optimizer=task.optimizer(), loss=task.loss)
    replayed = []
    for batch in fixed_batches(task, 6):
        # Before Keras 3.10, train_on_batch returned the running mean since the last reset.
        model.reset_metrics()
        replayed.append(float(model.train_on_batch(*batch)))
    assert result.losses == pytest.approx(replayed, rel=1e-6)


@pytest.mark.parametrize("where", [
    "tiny_mlp",                  # a compiled loss
    "zoo/guide_train_step",      # its own train_step, updating the compiled metrics itself
    # The rest in the slow tier: the quick tier keeps one of each way of computing the loss.
    pytest.param("zoo/custom_metric", marks=pytest.mark.slow),  # and a metric of the user's
    pytest.param("zoo/multi_io", marks=pytest.mark.slow),    # two outputs, a loss each
    pytest.param("zoo/vae", marks=pytest.mark.slow),         # its own train_step and trackers
    pytest.param("zoo/add_loss", marks=pytest.mark.slow),    # add_loss beside the compiled loss
    pytest.param("dcgan_by_hand", marks=pytest.mark.slow),   # d_loss, g_loss, two optimizers
])
def test_resetting_the_metrics_inside_the_step_records_the_same_losses(where, task_path,
                                                                       monkeypatch):
    # The step recorder needs each step's own loss; the metrics are reset inside the compiled
    # step (tuner.worker.trial.steps.reset_metrics_in_step) rather than eagerly before it.
    path = str(ZOO / f"{where[4:]}.py") if where.startswith("zoo/") else task_path(where)
    _same_losses_reset_in_step_or_eagerly(path, PrecisionConfig(), monkeypatch)


_JIT_TASK = """
import keras
import numpy as np

BATCH_SIZE = 32


def build_model():
    {build}


def compile_model(model, wrap_optimizer):
    model.compile(optimizer=wrap_optimizer(keras.optimizers.Adam(1e-3)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile={jit})


def train_data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(256, 12)).astype("float32"), rng.integers(0, 3, 256)
"""


def _small_model():
    import keras

    inputs = keras.Input(shape=(12,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))


@pytest.mark.slow
def test_the_reset_inside_the_step_holds_under_xla_and_for_a_model_loaded_from_a_file(
        tmp_path, monkeypatch):
    # As a GPU compiles by default (jit_compile=True, exercised here on the CPU), and a model
    # the user saved (a .keras file, loaded uncompiled); each under a mixed policy too.
    model_file = tmp_path / "saved.keras"
    _small_model().save(model_file)
    tasks = {"xla": ("inputs = keras.Input(shape=(12,))\n"
                     "    hidden = keras.layers.Dense(16, activation='relu')(inputs)\n"
                     "    return keras.Model(inputs, keras.layers.Dense(3, "
                     "activation='softmax')(hidden))", True),
             "loaded": (f"return keras.models.load_model({str(model_file)!r}, compile=False)",
                        False)}
    for name, (build, jit) in tasks.items():
        path = tmp_path / f"{name}.py"
        path.write_text(_JIT_TASK.format(build=build, jit=jit))
        for config in (PrecisionConfig(), PrecisionConfig("mixed_bfloat16")):
            _same_losses_reset_in_step_or_eagerly(str(path), config, monkeypatch)


def _same_losses_reset_in_step_or_eagerly(path, config, monkeypatch):
    from tuner.worker.trial import steps

    in_step = trial(path, config, steps=8)
    with monkeypatch.context() as patch:
        patch.setattr(steps, "reset_metrics_in_step", lambda model: False)
        eager = trial(path, config, steps=8)
    assert in_step.outcome is eager.outcome is TrialOutcome.COMPLETED, in_step.failure_message
    assert in_step.losses == pytest.approx(eager.losses, rel=1e-5)
    assert sorted(in_step.loss_terms) == sorted(eager.loss_terms)
    for name, values in eager.loss_terms.items():
        assert in_step.loss_terms[name] == pytest.approx(values, rel=1e-5), name
    # Not a running mean: the losses vary from step to step as the replayed ones do.
    assert len(set(in_step.losses)) > 1


def test_a_model_traced_before_is_reset_eagerly(task_path):
    from tuner.worker.task.task_loader import fixed_batches, load_task
    from tuner.worker.trial.steps import fit_steps, reset_metrics_in_step

    task = load_task(task_path("tiny_mlp"))
    model = task.build_model()
    model.compile(optimizer=task.optimizer(), loss=task.loss)
    model.make_train_function()   # its training step made without the reset
    assert reset_metrics_in_step(model) is False
    fit_steps(model, fixed_batches(task, 2), 2)
    fresh = task.build_model()
    fresh.compile(optimizer=task.optimizer(), loss=task.loss)
    assert reset_metrics_in_step(fresh) is True and reset_metrics_in_step(fresh) is True
    fit_steps(fresh, fixed_batches(task, 2), 2)
    assert reset_metrics_in_step(fresh) is True   # still known once its step is made


def test_only_a_step_made_without_the_reset_is_reset_eagerly(task_path):
    """Each step's metrics are reset once: in the compiled step where ``fit_steps`` made it,
    eagerly (``model.reset_metrics()``) before each step where the model's step existed before.
    Mutation caught: the in-step reset never marking the model (tuner/worker/trial/steps.py:
    every step then reset twice, the 0.2 ms a step lost)."""
    from tuner.worker.task.task_loader import fixed_batches, load_task
    from tuner.worker.trial.steps import _reset_unless_in_step, fit_steps

    task = load_task(task_path("tiny_mlp"))
    eager = {}
    for name, traced in (("traced", True), ("fresh", False)):
        model = task.build_model()
        model.compile(optimizer=task.optimizer(), loss=task.loss)
        if traced:
            model.make_train_function()
        fit_steps(model, fixed_batches(task, 2), 2)
        calls = []
        own = model.reset_metrics
        model.reset_metrics = lambda own=own, calls=calls: (calls.append(1), own())[-1]
        for _ in range(3):
            _reset_unless_in_step(model)
        eager[name] = len(calls)
    assert eager == {"traced": 3, "fresh": 0}


@pytest.fixture
def replays(monkeypatch):
    """Which way each divergence was replayed: "own" (the trial's model, from its starting
    state) or "built" (a model built again, its step traced again)."""
    from tuner.worker.trial import replay

    ways: list[str] = []
    own_replays, build_again = replay._replays, replay.compile_for_trial

    def on_own(*args):
        ways.append("own")
        return own_replays(*args)

    def built(*args):
        ways.append("built")
        return build_again(*args)

    monkeypatch.setattr(replay, "_replays", on_own)
    monkeypatch.setattr(replay, "compile_for_trial", built)
    return ways


def test_divergence_is_located_by_replaying_the_same_steps(task_path, replays):
    result = trial(task_path("overflow"), PrecisionConfig("mixed_float16"), steps=6)
    assert result.outcome is TrialOutcome.DIVERGED and result.first_non_finite_step is not None
    assert result.failure_layer == "amplify"
    assert replays == ["own"], result.first_non_finite_step


def test_probe_reports_what_each_group_and_pattern_selects(task_path):
    info = check_task(task_path("subclassed"), 4, patterns=("classifier/dense*", "nothing"))
    matches = info["float32_matches"]
    assert info["parameters"] == 16 * 32 + 32 + 4 * 32 + 32 * 3 + 3  # built by a first call
    assert set(matches["groups"]) == {"normalization", "softmax", "attention", "embedding"}
    assert matches["groups"]["normalization"] == ["classifier/batch_normalization"]
    assert matches["groups"]["softmax"] == ["classifier/dense_1"]
    assert matches["groups"]["attention"] == [] == matches["layers"]["nothing"]
    assert matches["layers"]["classifier/dense*"] == ["classifier/dense", "classifier/dense_1"]
    assert matches["all_layers"] == ["classifier/dense", "classifier/batch_normalization",
                                     "classifier/dense_1"]


@pytest.mark.slow   # several trainings: the quick tier keeps its five minutes
def test_training_memory_is_counted_from_the_models_tensors(task_path):
    def memory(cfg):
        return trial(task_path("tiny_mlp"), cfg, steps=6).training_memory

    def total(part):
        return sum(part.values())

    f32, bf16 = memory(PrecisionConfig()), memory(PrecisionConfig("bfloat16"))
    compensated = memory(PrecisionConfig("bfloat16", weight_update="compensated"))
    weights = (16 * 32 + 32 + 32 * 2 + 32 * 3 + 3) * 4
    assert f32["weights"] == {"float32": weights} and f32["gradients"] == {"float32": weights}
    # Adam's two moments, plus its scalar learning rate and step counter.
    assert 2 * weights <= total(f32["optimizer"]) <= 2 * weights + 16
    assert bf16["weights"] == {"bfloat16": weights // 2}
    assert total(bf16["optimizer"]) < total(f32["optimizer"]) / 2 + 16  # + the step counter
    assert compensated["optimizer"]["bfloat16"] == bf16["optimizer"]["bfloat16"] + weights // 2
    assert total(bf16["activations"]) * 2 == total(f32["activations"]) > 0
    assert f32["total_bytes"] == sum(total(f32[k]) for k in
                                     ("weights", "gradients", "optimizer", "activations"))


@pytest.mark.parametrize("keep_bytes, ways", [(None, ["own"]), (0, ["built"])])
def test_a_later_divergence_is_replayed_on_the_trials_own_traced_model(
        task_path, replays, monkeypatch, keep_bytes, ways):
    # The overflow comes at the fourth step, after the layer's own state and Dropout's seed
    # have moved: the replay must start from where the trial started, not where it ended.
    from tuner.worker.trial import replay

    if keep_bytes is not None:      # a model too large to keep a copy of: built again
        monkeypatch.setattr(replay, "KEEP_BYTES", keep_bytes)
    result = trial(task_path("late_overflow"), PrecisionConfig("mixed_float16"), steps=8)
    assert result.outcome is TrialOutcome.DIVERGED, result.losses
    assert result.first_non_finite_step >= 3, result.losses
    assert result.failure_layer == "grow"
    assert replays == ways


@pytest.mark.slow   # several trainings: the quick tier keeps its five minutes
def test_a_replay_that_does_not_train_to_the_trials_losses_is_built_again(
        task_path, replays, monkeypatch):
    # An unseeded TensorFlow op in the step draws on from where the trial left it: the own
    # replay's losses differ, so the model is built again from the seed (which draws the same).
    monkeypatch.setenv("LATE_OVERFLOW_NOISE", "1")
    result = trial(task_path("late_overflow"), PrecisionConfig("mixed_float16"), steps=8)
    assert result.outcome is TrialOutcome.DIVERGED and result.first_non_finite_step >= 3
    assert replays == ["own", "built"]
    assert result.failure_layer == "grow"


@pytest.mark.slow   # several trainings: the quick tier keeps its five minutes
def test_skips_and_scales_read_from_the_steps_logs_are_those_read_from_the_optimizer(
        task_path, monkeypatch):
    # A head near 290 under mixed_float16: its gradients times 2^15 overflow, so the dynamic
    # scale skips a step and halves. The compiled step logs each LossScaleOptimizer's
    # updates and scale (no variable read a step); read from the optimizer instead, every
    # step's scale and every skip are the same.
    from tuner.worker.trial import steps

    config = PrecisionConfig("mixed_float16", LossScale("dynamic"))
    logged = trial(task_path("kelvin_head"), config, steps=16)
    monkeypatch.setattr(steps, "_reported", lambda model, optimizer: None)
    read = trial(task_path("kelvin_head"), config, steps=16)
    assert logged.skipped and min(logged.loss_scales) < 2.0**15, logged.loss_scales
    assert (logged.skipped, logged.loss_scales, logged.losses) == \
        (read.skipped, read.loss_scales, read.losses)
