"""A new failure kind is one detector class and one rung, both defined here and passed to the
guard (``cfg.guard(detectors=[...], rungs=[...])``), no module of the guard edited: the
detector's finding is one trip, the rung answers it and ends the trip, the event carries the
kind. And every detector sees every step: one whose check fires does not keep the others from
theirs (a detector that counts sees every step of the training, the failing one included).
And the contract of a kind of your own: the guard's rungs leave it alone (``ladder.ANSWERS``),
so it spends none of the guard's repairs, never meets its last resort, and a trip your rung
leaves going changes nothing.
"""

from __future__ import annotations

import keras
import numpy as np

from tuner import PrecisionConfig
from tuner.apply.guard import Detector, End, Finding

STEPS_PER_EPOCH, EPOCHS = 16, 2


class LearningRateTooHigh(Detector):
    """The new kind: here it simply fires at steps 5 and 20 (a real one would read the loss
    it is handed, ``step.loss``)."""

    def after_step(self, training, step):
        if training.step in (5, 20):
            return Finding("learning_rate_too_high", f"step {training.step}")
        return None


class HalveTheLearningRate:
    """Its rung: answers its own kind only, and ends the trip (no diagnosis, no restore)."""

    def __call__(self, ladder, trip):
        if trip.kind != "learning_rate_too_high":
            return
        optimizer = ladder.training.model.optimizer
        optimizer.learning_rate.assign(optimizer.learning_rate * 0.5)
        trip.actions.append("halved the learning rate")
        trip.why, trip.end = "the loss is far above its start", End.DONE


class Counting(Detector):
    def __init__(self):
        self.steps = 0

    def after_step(self, training, step):
        self.steps += 1


def _train(*detectors, rungs=()):
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    config = PrecisionConfig("mixed_bfloat16")
    with config.scope():
        inputs = keras.Input(shape=(4,))
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(inputs)))
    model.compile(optimizer=config.wrap_optimizer(keras.optimizers.SGD(0.02)), loss="mse")
    guard = config.guard(verbose=0, check_every=None, detectors=detectors,
                         rungs=rungs)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS_PER_EPOCH * 8, 4)).astype("float32")
    y = (x.sum(axis=1) * 10).astype("float32")   # a loss of ~400 at the start
    model.fit(x, y, batch_size=8, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[guard])
    return model, guard


def test_a_new_failure_kind_is_a_detector_and_a_rung_passed_to_the_guard():
    counting = Counting()
    model, guard = _train(LearningRateTooHigh(), counting, rungs=[HalveTheLearningRate()])
    kinds = [event.kind for event in guard.events]
    assert kinds == ["learning_rate_too_high"] * 2, kinds
    assert [event.step for event in guard.events] == [5, 20]
    assert all(event.action == "halved the learning rate" for event in guard.events)
    assert float(model.optimizer.learning_rate.numpy()) == np.float32(0.02) / 4
    # the counting detector, asked after the failing one, saw every step all the same
    assert counting.steps == STEPS_PER_EPOCH * EPOCHS


# -- the contract: a kind of your own is your rungs' alone ---------------------------------------
class EveryOtherStep(Detector):
    """A kind of its own, firing at steps 2, 4, .. 16: eight times, more than max_repairs."""

    def after_step(self, training, step):
        if training.step % 2 == 0 and training.step <= 16:
            return Finding("every_other_step", f"step {training.step}")
        return None


class Notes:
    """A rung that answers its kind by noting it and never ends the trip."""

    def __init__(self):
        self.seen = []

    def __call__(self, ladder, trip):
        if trip.kind == "every_other_step":
            self.seen.append(ladder.training.step)


def test_a_kind_of_your_own_spends_no_repair_and_meets_no_last_resort():
    """Eight trips of a kind of its own under mixed_bfloat16 and the guard's max_repairs=5: the
    policy stays mixed, no layer moves (no last resort: it is the guard's own failures that
    spend its repairs), and the rung ran on each.
    Mutation caught: the guard's rungs answering every kind (tests/support/mutants.py)."""
    notes = Notes()
    model, guard = _train(EveryOtherStep(), rungs=[notes])
    assert [event.kind for event in guard.events] == ["every_other_step"] * 8
    assert notes.seen == [2, 4, 6, 8, 10, 12, 14, 16]
    assert guard.repairs == 0
    assert guard.config.policy == "mixed_bfloat16" and guard.config.float32.layers == ()
    assert all(layer.dtype_policy.name == "mixed_bfloat16" for layer in model.layers[1:])
    assert all(event.layers == () for event in guard.events)


def test_a_trip_no_rung_ends_changes_no_weight():
    """The same kind with a rung that leaves every trip going: the training's weights and
    losses are those of the same training with no detector at all (no restore, no move), and
    each event says nothing changed.
    Mutation caught: the guard's rungs answering every kind (tests/support/mutants.py)."""
    plain_model, plain = _train()
    model, guard = _train(EveryOtherStep(), rungs=[Notes()])
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(),
                                                    plain_model.get_weights()))
    assert guard.history[-1]["loss"] == plain.history[-1]["loss"]
    assert all(event.action == "nothing changed: no rung answers every_other_step"
               for event in guard.events) and len(guard.events) == 8
