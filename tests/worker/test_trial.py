"""Real trials in this process: recording, failure classes, the underflow case."""

import math

import pytest

pytest.importorskip("tensorflow")

from tuner.config import Float32Placement, LossScale, PrecisionConfig  # noqa: E402
from tuner.errors import TaskError  # noqa: E402
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec  # noqa: E402
from tuner.verdict import Verdict, judge  # noqa: E402
from tuner.worker.trial import probe_task, run_trial  # noqa: E402

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


def test_same_seed_same_losses(task_path):
    first = trial(task_path("tiny_mlp"), PrecisionConfig(), steps=8)
    second = trial(task_path("tiny_mlp"), PrecisionConfig(), steps=8)
    assert first.losses == second.losses


def test_pure_bfloat16_halves_weight_memory(task_path):
    full = trial(task_path("tiny_mlp"), PrecisionConfig(), steps=6)
    half = trial(task_path("tiny_mlp"), PrecisionConfig("bfloat16"), steps=6)
    assert half.weights_bytes * 2 == full.weights_bytes


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
                  PrecisionConfig("mixed_float16", float32=Float32Placement(layers=("bias_shift",))))
    assert fixed.outcome is TrialOutcome.COMPLETED


def test_subclassed_model_with_own_train_step_and_dataset(task_path):
    cfg = PrecisionConfig("mixed_float16", LossScale("dynamic"), float32=Float32Placement(("softmax",)))
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
    assert "must return a batched tf.data.Dataset" in bad.failure_message


def test_slow_trials_stop_early(task_path):
    result = trial(task_path("tiny_mlp"), PrecisionConfig(), stop_if_slower_than_ms=1e-6)
    assert result.outcome is TrialOutcome.STOPPED_SLOW
    assert len(result.losses) < 16 and "stopped" in result.stop_reason


def test_probe_describes_the_task_and_refuses_bad_ones(task_path):
    info = probe_task(task_path("subclassed"), 10)
    assert info["style"] == "subclassed" and info["batch_size"] == 32
    with pytest.raises(TaskError, match="must return a batched"):
        probe_task(task_path("bad_data"), 10)
    with pytest.raises(TaskError, match="build_model\\(\\) in broken_build.py raised"):
        probe_task(task_path("broken_build"), 10)
