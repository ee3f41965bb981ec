"""A model compiled as its config was tuned (tuner.apply.compiling): the trap of Keras's own
loss scale under mixed_float16 closed in the scope and by ``cfg.compile``, refused by the
guard in one line outside them; a GAN's own optimizers checked, its unused default not."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tuner import LossScale, PrecisionConfig
from tuner.apply.config_data import Epsilon
from tuner.errors import ConfigError

X = np.random.default_rng(0).normal(size=(128, 8)).astype("float32")
Y = X.sum(axis=1)

KINDS = {"none": LossScale("none"), "dynamic": LossScale("dynamic"),
         "fixed": LossScale("fixed", value=1024.0)}
def _compile_now():
    return next(vars(cls)["compile"] for cls in keras.Model.__mro__ if "compile" in vars(cls))


ORIGINAL = _compile_now()
EXPECTED = {"none": "Adam", "dynamic": "FlooredLossScaleOptimizer",
            "fixed": "FixedLossScaleOptimizer"}


def _build():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])


def _config(kind: str, **extra) -> PrecisionConfig:
    return PrecisionConfig(policy="mixed_float16", loss_scale=KINDS[kind], **extra)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("optimizer", ["plain", "wrapped", "name"])
def test_compiled_in_the_scope_without_compile_kwargs_trains_as_tuned(kind, optimizer):
    cfg = _config(kind)
    given = {"plain": keras.optimizers.Adam(), "name": "adam",
             "wrapped": cfg.wrap_optimizer(keras.optimizers.Adam())}[optimizer]
    with cfg.scope():
        model = _build()
        model.compile(given, loss="mse")   # positional, and no **cfg.compile_kwargs()
    assert type(model.optimizer).__name__ == EXPECTED[kind]
    if kind == "dynamic":
        assert model.optimizer.floor == 1.0
    model.fit(X, Y, epochs=1, verbose=0, callbacks=[cfg.guard(verbose=0)])  # not refused
    assert _compile_now() is ORIGINAL   # the scope's patch is gone


@pytest.mark.parametrize("kind", list(KINDS))
def test_cfg_compile_outside_the_scope_is_one_call(kind):
    cfg = _config(kind)
    with cfg.scope():
        model = _build()
    assert cfg.compile(model, keras.optimizers.Adam(1e-3), loss="mse") is model
    assert type(model.optimizer).__name__ == EXPECTED[kind]
    model.fit(X, Y, epochs=1, verbose=0, callbacks=[cfg.guard(verbose=0)])


def test_the_trap_outside_the_scope_is_refused_by_the_guard_in_one_line():
    """The issue's case: a float16 config tuned without a loss scale, the optimizer wrapped
    but compile_kwargs() forgotten, so Keras adds its own dynamic scale."""
    cfg = _config("none")
    with cfg.scope():
        model = _build()
    model.compile(optimizer=cfg.wrap_optimizer(keras.optimizers.Adam()), loss="mse")
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer   # Keras's own
    with pytest.raises(ConfigError) as refused:
        model.fit(X, Y, epochs=1, verbose=0, callbacks=[cfg.guard(verbose=0)])
    message = str(refused.value)
    assert "\n" not in message
    assert "applies a dynamic loss scale (Keras's own" in message
    assert "tuned with no loss scale" in message and "cfg.compile(model" in message
    assert int(model.optimizer.iterations.numpy()) == 0   # refused before its first step


@pytest.mark.parametrize("kind, compiled, says", [
    ("dynamic", "plain", "applies no loss scale, but the config was tuned with a dynamic"),
    ("fixed", "keras", "applies a dynamic loss scale (Keras's own, added by compile under "
                       "mixed_float16), but the config was tuned with a fixed"),
])
def test_other_loss_scales_than_the_tuned_one_are_refused(kind, compiled, says):
    cfg = _config(kind)
    with cfg.scope():
        model = _build()
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse",
                  auto_scale_loss=compiled == "keras")
    with pytest.raises(ConfigError, match=".*" + says.replace("(", r"\(").replace(")", r"\)")):
        model.fit(X, Y, epochs=1, verbose=0, callbacks=[cfg.guard(verbose=0)])


def test_kerass_own_dynamic_scale_under_a_dynamic_config_is_guarded_as_before():
    """tests/apply/guard's new-user case: the kind is the tuned one, the guard repairs its floor."""
    cfg = _config("dynamic")
    with cfg.scope():
        model = _build()
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    model.fit(X, Y, epochs=1, verbose=0, callbacks=[cfg.guard(verbose=0)])


def test_an_optimizer_epsilon_left_out_is_refused_and_the_scope_sets_it():
    cfg = PrecisionConfig(policy="mixed_bfloat16", epsilon=Epsilon(optimizer=1e-4))
    with cfg.scope():
        model = _build()
        model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    assert model.optimizer.epsilon == pytest.approx(1e-4)
    with cfg.scope():
        model = _build()
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    with pytest.raises(ConfigError, match="has epsilon 1e-07, but the config was tuned with "
                                          "0.0001"):
        model.fit(X, Y, epochs=1, verbose=0, callbacks=[cfg.guard(verbose=0)])


class _TwoOptimizers(keras.Model):
    """The Keras guide's GAN pattern: a compile that keeps optimizers of its own and calls
    ``super().compile()`` without one (Keras then adds an unused default)."""

    def __init__(self):
        super().__init__()
        self.body = keras.layers.Dense(1)

    def call(self, x):
        return self.body(x)

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer


def test_a_custom_compile_is_checked_on_its_own_optimizers_not_kerass_default():
    cfg = _config("fixed")
    with cfg.scope():
        model = _TwoOptimizers()
        model.compile(cfg.wrap_optimizer(keras.optimizers.Adam()),
                      cfg.wrap_optimizer(keras.optimizers.Adam()))
    from tuner.apply.compiling import untuned

    assert untuned(cfg, model) is None
    model.g_optimizer = keras.optimizers.Adam()   # one of them not wrapped
    assert untuned(cfg, model).startswith("the model's optimizer g_optimizer (Adam) applies "
                                          "no loss scale, but the config was tuned with a fixed")


def test_the_scope_restores_compile_when_its_body_raises():
    cfg = _config("none")
    with pytest.raises(RuntimeError), cfg.scope():
        assert _compile_now() is not ORIGINAL
        raise RuntimeError("the user's code failed")
    assert _compile_now() is ORIGINAL


def test_a_model_loaded_in_the_scope_is_compiled_from_its_file_as_before(tmp_path):
    """Keras compiles a loaded model from its saved compile config unless the model's class
    overrides compile(), which it tells by comparing with its trainer's: the scope's patch
    must not look like an override (a loaded model would come back uncompiled)."""
    import warnings

    model = _build()
    model.compile(optimizer="adam", loss="mse")
    model.save(tmp_path / "m.keras")
    cfg = _config("dynamic")
    with cfg.scope(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = keras.models.load_model(tmp_path / "m.keras")
    assert not [w for w in caught if "is custom" in str(w.message)]
    assert loaded.compiled and type(loaded.optimizer).__name__ == "FlooredLossScaleOptimizer"
    loaded.fit(X, Y, epochs=1, verbose=0, callbacks=[cfg.guard(verbose=0)])
