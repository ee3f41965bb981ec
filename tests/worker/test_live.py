"""Live models: the re-measurement builds and traces each config once, then trains it on."""

from tuner.apply.config import Float32Placement, PrecisionConfig
from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec
from tuner.worker.trial import live, live_models
from tuner.worker.trial.trial import run_trial


def _spec(path, cfg, **extra):
    return TrialSpec(0, path, cfg.to_dict(), 8, 3, **extra).to_dict()


def test_a_live_model_is_traced_once_and_trained_on(task_path):
    live_models.release()
    path = task_path("tiny_mlp")
    f32 = PrecisionConfig()
    bf16 = PrecisionConfig("mixed_bfloat16", float32=Float32Placement(("softmax",)))
    baseline = TrialResult.from_dict(run_trial(_spec(path, f32, keep_live=True)))
    assert baseline.trace_s > 0 and baseline.outcome is TrialOutcome.COMPLETED
    # Another trial in the same worker resets Keras's global state; the live model survives.
    other = TrialResult.from_dict(run_trial(_spec(path, bf16)))
    assert other.outcome is TrialOutcome.COMPLETED
    again = TrialResult.from_dict(live.run_live(_spec(path, f32)))
    assert again.outcome is TrialOutcome.COMPLETED, again.failure_message
    assert again.trace_s == 0 and again.setup_s == 0 and len(again.timed_steps_ms) == 5
    assert again.losses[0] < baseline.losses[0]  # it went on training the same model
    first = TrialResult.from_dict(live.run_live(_spec(path, bf16)))  # built on first use
    assert first.trace_s > 0
    second = TrialResult.from_dict(live.run_live(_spec(path, bf16)))
    assert second.trace_s == 0 and second.outcome is TrialOutcome.COMPLETED
    # The driver lets the worker keep only what the re-measurement may time.
    assert live_models.keep_only([_spec(path, bf16)]) == 1
    kept = TrialResult.from_dict(live.run_live(_spec(path, bf16)))
    assert kept.trace_s == 0
    assert live_models.release() == 1 and live_models.release() == 0


def test_a_failed_trial_leaves_no_live_model(task_path):
    live_models.release()
    broken = TrialResult.from_dict(run_trial(_spec(task_path("broken_build"), PrecisionConfig(),
                                                   keep_live=True)))
    assert broken.outcome is TrialOutcome.FAILED
    assert live_models.release() == 0
