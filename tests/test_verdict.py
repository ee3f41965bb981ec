import math

from tuner.trial_types import FailureClass, TrialOutcome, TrialResult
from tuner.judging.verdict import Verdict, judge, loss_decrease

RULES = dict(floor=1.0, max_skipped_fraction=0.2, min_loss_decrease_ratio=0.9, expected_steps=20)


def result(losses, times=None, scales=None, **extra):
    return TrialResult(number=1, outcome=extra.pop("outcome", TrialOutcome.COMPLETED),
                       losses=list(losses), step_times_ms=times or [10.0] * len(losses),
                       loss_scales=scales or [None] * len(losses), warmup_steps=3, **extra)


BASELINE = result([2.0 - 0.05 * i for i in range(20)])


def test_loss_decrease_uses_start_and_end_windows():
    # 20 steps -> windows of 3: mean(2.0, 1.95, 1.9) - mean(1.15, 1.1, 1.05)
    assert math.isclose(loss_decrease(BASELINE.losses), 1.95 - 1.1)
    assert loss_decrease([1.0]) is None


def test_matching_the_baseline_is_stable():
    judgement = judge(result(BASELINE.losses, times=[20.0] * 3 + [5.0] * 17), BASELINE, **RULES)
    assert judgement.verdict is Verdict.STABLE and judgement.reason == ""
    assert math.isclose(judgement.loss_decrease_ratio, 1.0)
    assert judgement.median_step_ms == 5.0  # warm-up steps excluded


def test_too_little_learning_is_unstable_with_the_percentage():
    flat = result([2.0 - 0.02 * i for i in range(20)])
    judgement = judge(flat, BASELINE, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE
    assert "reached 40% of float32's loss decrease" in judgement.reason


def test_non_finite_loss_names_the_step():
    diverged = result([2.0, 1.9, float("nan")], first_non_finite_step=2,
                      outcome=TrialOutcome.DIVERGED)
    judgement = judge(diverged, BASELINE, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE
    assert judgement.reason.startswith("loss non-finite at step 2 (the forward pass is finite")
    diverged.failure_layer = "dense_2"
    assert judge(diverged, BASELINE, **RULES).reason == \
        "loss non-finite at step 2 (first non-finite output: layer dense_2)"


def test_collapsed_loss_scale_is_unstable():
    scales = [1024.0, 512.0, 4.0, 1.0] + [1.0] * 16
    judgement = judge(result(BASELINE.losses, scales=scales, initial_loss_scale=2048.0),
                      BASELINE, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE
    assert judgement.reason.startswith("the loss scale collapsed: it halved from 2048 to its "
                                       "floor (1) (11 times by step 4) and never grew back")


def test_a_collapse_is_judged_from_where_the_scale_started():
    """From 2^15, a fall to 2^9 is six halvings: collapsed, though far above the floor. From
    the diagnostics' 2^2, one overflow to the floor is not a collapse (skipped steps count)."""
    high = judge(result(BASELINE.losses, scales=[2.0**9] * 20, initial_loss_scale=2.0**15),
                 BASELINE, **RULES)
    assert "collapsed: it halved from 32768 to 512 (6 times" in high.reason
    low = judge(result(BASELINE.losses, scales=[1.0] * 20, initial_loss_scale=2.0**1,
                       skipped_steps=1), BASELINE, **RULES)
    assert low.stable, low.reason
    recovered = [2.0**15 / 2**k for k in range(8)] + [2.0**11] * 12   # fell 7x, grew back 8x
    assert judge(result(BASELINE.losses, scales=recovered, initial_loss_scale=2.0**15),
                 BASELINE, **RULES).stable


def test_too_many_skipped_steps_is_unstable():
    judgement = judge(result(BASELINE.losses, skipped_steps=5), BASELINE, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE and "skipped 5 of 20 steps" in judgement.reason
    assert judge(result(BASELINE.losses, skipped_steps=4), BASELINE, **RULES).stable


def test_failures_and_early_stops_keep_their_reason():
    failed = TrialResult.failed(3, FailureClass.DTYPE_MISMATCH, "dtype mismatch in layer x")
    assert judge(failed, BASELINE, **RULES).verdict is Verdict.FAILED
    assert judge(failed, BASELINE, **RULES).reason == "dtype mismatch in layer x"
    slow = result([2.0, 1.9], outcome=TrialOutcome.STOPPED_SLOW, stop_reason="stopped at step 1")
    judgement = judge(slow, BASELINE, **RULES)
    assert judgement.verdict is Verdict.STOPPED_SLOW and judgement.reason == "stopped at step 1"


def test_baseline_that_did_not_learn_falls_back_to_no_worse():
    flat_baseline = result([1.0] * 20)
    assert judge(result([1.0] * 20), flat_baseline, **RULES).stable
    worse = judge(result([1.0] * 10 + [3.0] * 10), flat_baseline, **RULES)
    assert worse.verdict is Verdict.UNSTABLE


# -- where a trial ends, and how it validates ----------------------------------------------
def _falls_to(end):
    """From 27 (learning the mean) down to ``end`` in 20 steps, exponentially."""
    return [end + (27.0 - end) * 0.6**i for i in range(20)]


def _validation(loss, scatter=0.01):
    return {"loss": loss, "batch_losses": [loss + scatter * (i - 3.5) / 3.5 for i in range(8)],
            "metrics": {}, "batches": 8, "samples": 64, "source": "val_data"}


def test_a_plateau_above_float32_cannot_hide_behind_a_large_first_drop():
    base = result(_falls_to(0.03))
    plateau = result(_falls_to(0.4))   # 98.6% of float32's decrease, but 13x its end level
    judgement = judge(plateau, base, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE
    assert judgement.reason.startswith("ended at a training loss 0.403 vs float32's 0.033 (12x")
    assert "although it reached 99% of float32's loss decrease" in judgement.reason
    assert judge(result(_falls_to(0.035)), base, **RULES).stable   # within the allowance


def test_a_trial_that_validates_worse_beyond_noise_is_unstable_in_the_models_terms():
    base = result(_falls_to(0.03), validation=_validation(0.030, scatter=0.002))
    worse = result(_falls_to(0.03), validation=_validation(0.34))
    judgement = judge(worse, base, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE
    assert judgement.reason.startswith("validation loss 0.34 vs float32's 0.03 (11x; noise +-")
    close = result(_falls_to(0.03), validation=_validation(0.033))
    assert judge(close, base, **RULES).stable


def test_validation_within_float32s_batch_noise_is_stable_even_beyond_the_allowance():
    base = result(_falls_to(0.03), validation=_validation(0.5, scatter=0.5))
    assert judge(result(_falls_to(0.03), validation=_validation(0.7)), base, **RULES).stable


def test_a_model_that_cannot_be_evaluated_is_judged_on_its_training_losses():
    base = result(_falls_to(0.03), validation={"error": "model.evaluate raised ...",
                                               "source": "val_data"})
    assert judge(result(_falls_to(0.03), validation=_validation(9.0)), base, **RULES).stable
