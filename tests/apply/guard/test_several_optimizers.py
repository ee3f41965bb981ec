"""A model that trains with optimizers of its own is guarded, not refused: the Keras guide's GAN
(examples/dcgan.py: ``compile(d_optimizer, g_optimizer, loss_fn)``, a ``train_step`` of its
own and no ``call``) under ``mixed_float16`` with a fixed loss scale of 2^24 on both
optimizers, at which every gradient overflows float16: unguarded, no update is ever applied
(the GAN stays where it started); guarded, each optimizer's skipped run is a failure of its
own, and each one's scale is lowered to where a step of the GAN's own ``train_step`` on the
kept batch applies, and the GAN trains, still under mixed_float16.
"""

from __future__ import annotations

import math

import keras
import pytest

from tuner import PrecisionConfig
from tuner.apply.config import LossScale
from tests.apply.guard.test_repairs import ROOT, _task

pytestmark = pytest.mark.slow
OWN = ("d_optimizer", "g_optimizer")


def _fit(task, config: PrecisionConfig, guard: bool):
    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    with config.scope():
        model = task.build_model()
    task.compile_model(model, config.wrap_optimizer)
    watcher = config.guard(max_skipped=10) if guard else None
    history = model.fit(task.train_data()[:512], batch_size=task.BATCH_SIZE, epochs=2,
                        shuffle=False, verbose=0, callbacks=[watcher] if watcher else [])
    applied = {name: int(getattr(model, name).iterations.numpy()) for name in OWN}
    return model, history.history, applied, watcher


def test_a_gans_two_loss_scales_are_each_repaired_and_the_gan_trains():
    task = _task(ROOT / "examples" / "dcgan.py")
    config = PrecisionConfig(policy="mixed_float16", loss_scale=LossScale("fixed", value=2.0**24))
    _, unguarded, frozen, _ = _fit(task, config, guard=False)
    model, guarded, applied, watcher = _fit(task, config, guard=True)
    assert frozen == {"d_optimizer": 0, "g_optimizer": 0}   # every update skipped
    assert all(count > 0 for count in applied.values()), applied
    assert [event.kind for event in watcher.events] == ["skipped_updates"] * 2
    assert sorted(event.seen.split(":")[0] for event in watcher.events) == sorted(OWN)
    assert all("fixed loss scale lowered" in event.action for event in watcher.events)
    for name in OWN:   # each optimizer's own scale, lowered
        assert float(getattr(model, name).dynamic_scale.numpy()) < 2.0**24
    assert watcher.config.policy == "mixed_float16"
    assert watcher.config.loss_scale.value < 2.0**24
    assert all(math.isfinite(value) for values in guarded.values() for value in values)
    # unguarded the discriminator's loss stays at its start; guarded it learns
    assert abs(unguarded["d_loss"][-1] - unguarded["d_loss"][0]) < 1e-3
    assert guarded["d_loss"][-1] < unguarded["d_loss"][-1] - 0.01   # measured 0.682 vs 0.702
    assert watcher.history[-1]["skipped_steps_d_optimizer"] == 0
