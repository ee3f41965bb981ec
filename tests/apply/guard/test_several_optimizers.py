"""A model that trains with optimizers of its own is guarded, not refused, every failing
optimizer in one trip, each at its own scale:

- the Keras guide's GAN (examples/dcgan.py: ``compile(d_optimizer, g_optimizer, loss_fn)``, a
  ``train_step`` of its own and no ``call``) under ``mixed_float16`` with a fixed loss scale of
  2^30 on both optimizers, at which every gradient overflows from the first step: unguarded no
  update is ever applied; guarded, both scales are lowered in one trip on the first skipped
  update (the kept batch's gradients overflow 16x below the scale: no run of skips to wait
  for), nothing is restored (a skipped update changes no weight), and after 4 epochs both
  losses are within 25% of float32's;
- only the second of two optimizers overflows (the discriminator at a fixed 2^8 that fits, the
  generator at 2^30): only the generator's scale is lowered, and the discriminator's updates
  are all kept (no restore throws them away).
"""

from __future__ import annotations

import math

import keras
import pytest

from tests.apply.guard.test_repairs import ROOT, _task
from tuner import PrecisionConfig
from tuner.apply.config import LossScale

pytestmark = pytest.mark.slow
OWN = ("d_optimizer", "g_optimizer")
EPOCHS, ROWS = 4, 512          # 16 steps an epoch
FLOAT16_AT = {exponent: PrecisionConfig(policy="mixed_float16",
                                        loss_scale=LossScale("fixed", value=2.0**exponent))
              for exponent in (8, 30)}


def _fit(config: PrecisionConfig, guard: bool, d_config: PrecisionConfig | None = None):
    """The guide's GAN for ``EPOCHS``; ``d_config``: the discriminator's optimizer wrapped by
    another config than the generator's."""
    task = _task(ROOT / "examples" / "dcgan.py")
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    with config.scope():
        model = task.build_model()
    model.compile(d_optimizer=(d_config or config).wrap_optimizer(keras.optimizers.Adam(3e-4)),
                  g_optimizer=config.wrap_optimizer(keras.optimizers.Adam(3e-4)),
                  loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    watcher = config.guard(verbose=0, check_budget=None) if guard else None
    history = model.fit(task.train_data()[:ROWS], batch_size=task.BATCH_SIZE, epochs=EPOCHS,
                        shuffle=False, verbose=0, callbacks=[watcher] if watcher else [])
    applied = {name: int(getattr(model, name).iterations.numpy()) for name in OWN}
    return model, history.history, applied, watcher


@pytest.fixture(scope="module")
def float32():
    return _fit(PrecisionConfig(), guard=False)[1]


def test_both_overflowing_scales_are_lowered_in_one_trip_and_the_gan_trains_as_float32(float32):
    config = FLOAT16_AT[30]
    _, unguarded, frozen, _ = _fit(config, guard=False)
    model, guarded, applied, watcher = _fit(config, guard=True)
    assert frozen == {"d_optimizer": 0, "g_optimizer": 0}   # every update skipped
    assert [event.kind for event in watcher.events] == ["skipped_updates"]   # one trip
    event = watcher.events[0]
    assert event.step == 1   # on the first skipped update, not after a run of them
    assert all(f"{name}: fixed loss scale lowered" in event.action for name in OWN)
    assert "restored" not in event.action   # nothing applied, so nothing to restore
    assert all(count >= EPOCHS * ROWS // 32 - 1 for count in applied.values()), applied
    for name in OWN:   # each optimizer's own scale, lowered
        assert float(getattr(model, name).dynamic_scale.numpy()) < 2.0**24
    assert watcher.config.policy == "mixed_float16"
    assert all(math.isfinite(value) for values in guarded.values() for value in values)
    assert abs(unguarded["d_loss"][-1] - unguarded["d_loss"][0]) < 1e-3   # learns nothing
    # measured (seed 0): d_loss 0.533 against float32's 0.528, g_loss 0.734 against 0.734
    for loss in ("d_loss", "g_loss"):
        assert abs(guarded[loss][-1] - float32[loss][-1]) <= 0.25 * float32[loss][-1], loss
    assert watcher.history[-1]["skipped_steps_d_optimizer"] == 0
    assert watcher.history[-1]["skipped_steps_g_optimizer"] == 0


def test_only_the_second_optimizer_overflowing_is_repaired_and_the_first_keeps_its_steps(
        float32):
    model, guarded, applied, watcher = _fit(FLOAT16_AT[30], guard=True,
                                            d_config=FLOAT16_AT[8])
    assert [event.kind for event in watcher.events] == ["skipped_updates"]
    event = watcher.events[0]
    assert event.seen.startswith("g_optimizer:") and "d_optimizer" not in event.seen
    assert "g_optimizer: fixed loss scale lowered" in event.action
    assert "d_optimizer" not in event.action and "restored" not in event.action
    assert float(model.d_optimizer.dynamic_scale.numpy()) == 2.0**8   # left as it was
    assert applied["d_optimizer"] == EPOCHS * ROWS // 32   # not one of its updates undone
    for loss in ("d_loss", "g_loss"):
        assert abs(guarded[loss][-1] - float32[loss][-1]) <= 0.25 * float32[loss][-1], loss
