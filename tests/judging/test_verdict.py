import math

from tuner.judging.verdict import Verdict, judge, loss_decrease
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult

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


def _dynamic(scales, skipped, start=2.0**15):
    return result(BASELINE.losses, scales=scales, initial_loss_scale=start,
                  loss_scale_kind="dynamic", skipped=list(skipped), skipped_steps=len(skipped))


def test_a_scale_that_keeps_halving_to_its_floor_has_collapsed():
    scales = [2.0**15 / 2**(i + 1) for i in range(15)] + [1.0] * 5   # every step skipped
    judgement = judge(_dynamic(scales, range(20)), BASELINE, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE
    assert judgement.reason == ("the loss scale collapsed: non-finite gradients at every scale "
                                "it tried, from 32768 down to its floor (1); the last 5 steps "
                                "were all skipped (20 of 20 in all)")


def test_a_scale_that_backs_off_and_settles_has_not_collapsed():
    """Keras's 2^15 backs off to 2^9 in 6 skipped steps, then trains: the mechanism working.
    Those first skips do not count against the skipped-step bound either."""
    scales = [2.0**15 / 2**(i + 1) for i in range(6)] + [2.0**9] * 14
    judgement = judge(_dynamic(scales, range(6)), BASELINE, **RULES)
    assert judgement.stable, judgement.reason
    # Judged the same from any start: from the diagnostics' 2^2, one overflow is no collapse.
    assert judge(_dynamic([1.0] * 20, [0], start=2.0), BASELINE, **RULES).stable


def test_skips_after_the_scale_settled_count_and_say_so():
    scales = [2.0**14] + [2.0**13] * 19
    skipped = [0, 3, 6, 9, 12, 15]             # the first back-off, then five more
    judgement = judge(_dynamic(scales, skipped), BASELINE, **RULES)
    assert judgement.reason.startswith("skipped 5 of 20 steps after the scale's first back-off "
                                       "(non-finite gradients at scale 8192)")
    fixed = result(BASELINE.losses, scales=[1024.0] * 20, loss_scale_kind="fixed",
                   skipped=list(range(6)), skipped_steps=6)   # a fixed scale never backs off
    assert judge(fixed, BASELINE, **RULES).reason.startswith("skipped 6 of 20 steps "
                                                             "(non-finite gradients at scale")


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
