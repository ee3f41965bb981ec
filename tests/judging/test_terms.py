"""Judging a model that returns several losses and keeps several optimizers (a GAN): each loss
against float32's run of it, each optimizer's loss scale on its own, the task's val_metric.
Pure Python: hand-made results, no TensorFlow."""

import math

from tuner.judging.terms import band_gap, stretch_terms_gap, term_gap, terms_gap
from tuner.judging.verdict import Verdict, any_collapse, judge, metric_gap
from tuner.trial_types import TrialOutcome, TrialResult

RULES = dict(floor=1.0, max_skipped_fraction=0.2, min_loss_decrease_ratio=0.9)
STEPS = 40


def wave(level, swing, steps=STEPS, period=9.0, trend=0.0):
    """An adversarial loss: it oscillates around ``level`` (plus ``trend`` per step)."""
    return [level + swing * math.sin(i * 2 * math.pi / period) + trend * i for i in range(steps)]


def falling(start, end, steps=STEPS):
    return [start + (end - start) * i / (steps - 1) for i in range(steps)]


def gan_result(d_loss, g_loss, **extra):
    return TrialResult(number=1, outcome=TrialOutcome.COMPLETED,
                       losses=[d + g for d, g in zip(d_loss, g_loss)],
                       loss_terms={"d_loss": d_loss, "g_loss": g_loss},
                       step_times_ms=[10.0] * len(d_loss), loss_scales=[None] * len(d_loss),
                       **extra)


FLOAT32 = gan_result(wave(0.65, 0.05), wave(0.75, 0.08))


def test_an_adversarial_loss_inside_float32s_band_is_stable():
    # Another phase of the same oscillation, a little lower: what float32 itself does.
    trial = gan_result(wave(0.63, 0.05, period=11.0), wave(0.77, 0.07, period=7.0))
    judgement = judge(trial, FLOAT32, expected_steps=STEPS, **RULES)
    assert judgement.verdict is Verdict.STABLE, judgement.reason


def test_a_discriminator_that_wins_leaves_the_band_and_is_named():
    # d_loss goes to zero: the discriminator tells every fake apart, the generator learns nothing.
    trial = gan_result(falling(0.65, 0.01), wave(0.75, 0.08))
    judgement = judge(trial, FLOAT32, expected_steps=STEPS, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE and judgement.shortfall
    assert judgement.reason.startswith("d_loss ended at 0.0")
    assert "outside float32's band" in judgement.reason


def test_a_loss_float32_brings_down_must_come_down_to_its_level():
    float32 = gan_result(falling(2.0, 0.5), wave(0.75, 0.08))
    same = gan_result(falling(2.0, 0.55), wave(0.74, 0.08))
    stuck = gan_result(falling(2.0, 1.6), wave(0.75, 0.08))
    assert term_gap("d_loss", same.loss_terms["d_loss"], float32.loss_terms["d_loss"]) == ""
    reason = terms_gap(stuck.loss_terms, float32.loss_terms)
    assert reason.startswith("d_loss ended at 1.6") and "vs float32's 0.5" in reason


def test_a_drift_away_from_float32_is_caught_before_it_leaves_the_band():
    reference = wave(0.7, 0.02)
    drifting = [0.7] * (STEPS // 2) + falling(0.7, 0.52, STEPS - STEPS // 2)
    assert "drifted by -0.1" in band_gap("g_loss", drifting, reference, 0.01)
    assert band_gap("g_loss", wave(0.7, 0.02, period=5.0), reference, 0.01) == ""


def test_a_loss_the_trial_does_not_return_or_makes_non_finite_is_named():
    assert terms_gap({"d_loss": FLOAT32.loss_terms["d_loss"]}, FLOAT32.loss_terms) == \
        "g_loss was not returned by the train_step, while float32's was"
    broken = FLOAT32.loss_terms["g_loss"][:5] + [math.inf]
    assert term_gap("g_loss", broken, FLOAT32.loss_terms["g_loss"]) == \
        "g_loss non-finite at step 5"


def test_the_non_finite_loss_is_named_among_several():
    trial = gan_result([0.7, 0.6, math.inf], [0.7, 0.8, 0.9], first_non_finite_step=2)
    trial.outcome = TrialOutcome.DIVERGED
    judgement = judge(trial, FLOAT32, expected_steps=STEPS, **RULES)
    assert judgement.reason.startswith("d_loss non-finite at step 2 (every layer's output was "
                                       "finite: it arose in the train_step's own ops")


def optimizer(name, scales, skipped):
    return {"name": name, "initial_loss_scale": 32768.0, "loss_scales": scales,
            "skipped": skipped}


def test_one_optimizers_collapse_is_named_while_the_others_scale_works():
    steps = 12
    body = optimizer("body_optimizer", [2.0 ** -i * 32768 for i in range(steps)],
                     list(range(steps)))   # halves every step: nothing fits
    head = optimizer("head_optimizer", [16384.0] * steps, [0])   # backs off once, then fine
    result = TrialResult(number=1, outcome=TrialOutcome.COMPLETED, losses=[1.0] * steps,
                         loss_scales=[min(a, b) for a, b in zip(body["loss_scales"],
                                                                head["loss_scales"])],
                         skipped=list(range(steps)), skipped_steps=steps,
                         loss_scale_kind="dynamic", optimizers=[head, body])
    reason = any_collapse(result, floor=1.0)
    assert reason.startswith("body_optimizer: the loss scale collapsed")
    result.optimizers = [head]
    result.skipped, result.skipped_steps = [0], 1
    assert any_collapse(result, floor=1.0) == ""


def test_val_metric_is_judged_lower_is_better_with_the_level_allowance():
    base = {"error": "cannot be evaluated", "val_metric": 0.040}
    assert metric_gap({"val_metric": 0.045}, base) == ""        # within 25%
    assert metric_gap({"val_metric": 0.010}, base) == ""        # better
    assert metric_gap({"val_metric": 0.080}, base).startswith("val_metric 0.08 vs float32's 0.04")
    assert metric_gap({"val_metric_error": "val_metric(model) raised ValueError: x"}, base) == \
        "val_metric failed where float32's ran: val_metric(model) raised ValueError: x"
    assert metric_gap({"val_metric": math.nan}, base).startswith("val_metric non-finite")
    assert metric_gap({"val_metric": 9.0}, {"loss": 1.0}) == ""   # float32 has none: no rule


def test_a_trial_judged_on_its_val_metric():
    trial = gan_result(wave(0.63, 0.05, period=11.0), wave(0.77, 0.07, period=7.0),
                       validation={"error": "no call()", "val_metric": 0.09})
    float32 = gan_result(FLOAT32.loss_terms["d_loss"], FLOAT32.loss_terms["g_loss"],
                         validation={"error": "no call()", "val_metric": 0.04})
    judgement = judge(trial, float32, expected_steps=STEPS, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE
    assert judgement.reason.startswith("val_metric 0.09 vs float32's 0.04")


def test_the_confirmation_compares_each_loss_over_its_last_stretch():
    first = {"d_loss": wave(0.7, 0.05), "g_loss": wave(0.9, 0.05)}
    last = {"d_loss": wave(0.65, 0.05), "g_loss": wave(1.1, 0.05)}
    assert stretch_terms_gap(first, last, {"d_loss": wave(0.66, 0.05, period=7.0),
                                           "g_loss": wave(1.05, 0.05, period=5.0)}) == ""
    assert "g_loss ended at 2.5" in stretch_terms_gap(
        first, last, {"d_loss": wave(0.66, 0.05), "g_loss": wave(2.5, 0.05)})
    # A loss float32 brought down since the first stretch: the pick must end near its level.
    falling_first = {"kl_loss": [3.0] * 10}
    assert "kl_loss over the last stretch 2" in stretch_terms_gap(
        falling_first, {"kl_loss": [1.0, 1.01] * 5}, {"kl_loss": [2.0, 2.01] * 5})


def test_a_back_off_that_only_ends_at_the_floor_counts_every_skip():
    """A critic whose scale halved from 2^15 to the floor, its update skipped in 15 of 16
    steps (the WGAN-GP's repaired trial), had not found a working scale: not a back-off."""
    steps = 16
    critic = optimizer("c_optimizer", [2.0 ** (14 - i) if i < 15 else 1.0 for i in range(steps)],
                       list(range(15)))
    generator = optimizer("g_optimizer", [2048.0] * steps, [0, 1, 2, 3])   # a back-off
    result = TrialResult(number=1, outcome=TrialOutcome.COMPLETED, losses=[1.0] * steps,
                         loss_scales=[min(a, b) for a, b in zip(critic["loss_scales"],
                                                                generator["loss_scales"])],
                         skipped=list(range(15)), skipped_steps=15, loss_scale_kind="dynamic",
                         optimizers=[generator, critic])
    judgement = judge(result, None, expected_steps=steps, **RULES)
    assert judgement.verdict is Verdict.UNSTABLE
    assert judgement.reason == ("c_optimizer: skipped 15 of 16 steps (non-finite gradients at "
                                "scale 1); at most 20% allowed")
    # The same back-off ending above the floor (at 2) is the mechanism working.
    critic["loss_scales"][14:] = [2.0, 2.0]
    critic["skipped"] = list(range(14))
    result.loss_scales = [min(a, b) for a, b in zip(critic["loss_scales"],
                                                    generator["loss_scales"])]
    assert judge(result, None, expected_steps=steps, **RULES).verdict is Verdict.STABLE


def test_a_val_metric_given_per_batch_is_weighed_against_float32s_scatter():
    scattered = [0.01, 0.07, 0.02, 0.06, 0.03, 0.05, 0.04, 0.04]   # mean 0.04, 2 s.e. 0.014
    base = {"val_metric": 0.04, "val_metric_values": scattered}
    assert metric_gap({"val_metric": 0.054}, base) == ""              # inside the scatter
    assert metric_gap({"val_metric": 0.054}, {"val_metric": 0.04}) != ""   # a bare number
    assert "noise +-0.014" in metric_gap({"val_metric": 0.07}, base)
