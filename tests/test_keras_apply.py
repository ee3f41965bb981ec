"""cfg.scope() and cfg.wrap_optimizer() on real Keras models of all three styles."""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from tuner.config import Epsilon, Float32Placement, LossScale, PrecisionConfig  # noqa: E402
from tuner.keras_apply import FlooredLossScaleOptimizer, current_loss_scale  # noqa: E402

CFG = PrecisionConfig("mixed_float16", LossScale("dynamic"), Epsilon(1e-4, 1e-3),
                      Float32Placement(("normalization", "softmax"), ("keep_me",)))
EXPECTED = {"keep_me": "float32", "norm": "float32", "plain": "float16", "probs": "float32"}


def functional():
    inputs = keras.Input((8,))
    x = keras.layers.Dense(16, name="keep_me")(inputs)
    x = keras.layers.LayerNormalization(name="norm")(x)
    x = keras.layers.Dense(16, name="plain")(x)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="probs")(x))


def sequential():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="keep_me"),
                             keras.layers.LayerNormalization(name="norm"),
                             keras.layers.Dense(16, name="plain"),
                             keras.layers.Dense(3, activation="softmax", name="probs")])


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.a = keras.layers.Dense(16, name="keep_me")
        self.b = keras.layers.LayerNormalization(name="norm")
        self.c = keras.layers.Dense(16, name="plain")
        self.d = keras.layers.Dense(3, activation="softmax", name="probs")

    def call(self, x):
        return self.d(self.c(self.b(self.a(x))))


@pytest.fixture(autouse=True)
def clean_keras():
    keras.backend.clear_session()
    yield
    keras.backend.clear_session()


@pytest.mark.parametrize("build", [functional, sequential, Subclassed])
def test_scope_places_matched_layers_in_float32(build):
    with CFG.scope():
        model = build()
        assert keras.config.dtype_policy().name == "mixed_float16"
        assert keras.config.epsilon() == 1e-4
    output = model(np.ones((2, 8), "float32"))  # subclassed layers are built here, after exit
    layers = {layer.name: layer for layer in model.layers if layer.name in EXPECTED}
    assert set(layers) == set(EXPECTED)
    for name, dtype in EXPECTED.items():
        assert layers[name].compute_dtype == dtype, name
        assert layers[name].variable_dtype == "float32"
    assert output.dtype == "float32"  # the softmax output stayed in float32


def test_scope_restores_global_state_even_on_error():
    keras.config.set_epsilon(1e-7)
    original_init = keras.layers.Layer.__init__
    with pytest.raises(RuntimeError):
        with CFG.scope():
            raise RuntimeError("boom")
    assert keras.config.dtype_policy().name == "float32"
    assert keras.config.floatx() == "float32" and keras.config.epsilon() == 1e-7
    assert keras.layers.Layer.__init__ is original_init
    assert keras.layers.Dense(2).compute_dtype == "float32"


def test_pure_float16_keeps_float32_layers_with_float32_weights():
    cfg = PrecisionConfig("float16", float32=Float32Placement(("softmax",)))
    with cfg.scope():
        model = Subclassed()
        model(np.ones((2, 8), "float32"))
    assert model.c.variable_dtype == "float16" and model.c.kernel.dtype == "float16"
    assert model.d.compute_dtype == "float32" and model.d.kernel.dtype == "float32"


def test_explicit_layer_dtype_is_respected():
    with CFG.scope():
        layer = keras.layers.Dense(3, activation="softmax", dtype="float16", name="forced")
        keras.Sequential([keras.Input((4,)), layer])
    assert layer.compute_dtype == "float16"


def test_wrap_optimizer_dynamic_scale_with_floor_and_epsilon():
    optimizer = CFG.wrap_optimizer(keras.optimizers.Adam())
    assert isinstance(optimizer, FlooredLossScaleOptimizer)
    assert optimizer.inner_optimizer.epsilon == 1e-3
    assert current_loss_scale(optimizer) == 2.0**15
    variable = keras.Variable(np.ones(2, "float32"))
    optimizer.build([variable])
    for _ in range(20):  # every step non-finite: the scale halves, but stops at the floor
        optimizer.apply([np.array([np.inf, 1.0], "float32")], [variable])
    assert current_loss_scale(optimizer) == 1.0
    assert np.all(np.isfinite(variable.numpy()))  # non-finite updates were skipped


def test_wrap_optimizer_fixed_and_none():
    fixed = PrecisionConfig("mixed_float16", LossScale("fixed", value=128.0))
    optimizer = fixed.wrap_optimizer(keras.optimizers.SGD())
    assert current_loss_scale(optimizer) == 128.0
    variable = keras.Variable(np.zeros(2, "float32"))
    for _ in range(3):  # non-finite steps are skipped; a fixed scale does not move
        optimizer.apply([np.array([np.inf, 1.0], "float32")], [variable])
    assert current_loss_scale(optimizer) == 128.0 and np.all(variable.numpy() == 0.0)
    optimizer.apply([np.array([128.0, 256.0], "float32")], [variable])
    assert current_loss_scale(optimizer) == 128.0
    np.testing.assert_allclose(variable.numpy(), [-0.01, -0.02])  # unscaled, then SGD lr 0.01
    plain = PrecisionConfig("mixed_bfloat16").wrap_optimizer(keras.optimizers.SGD())
    assert current_loss_scale(plain) is None
    with pytest.raises(TypeError, match="has no `epsilon`"):
        PrecisionConfig(epsilon=Epsilon(optimizer=1e-4)).wrap_optimizer(keras.optimizers.SGD())


def test_applied_config_trains_like_the_readme_says():
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    with CFG.scope():
        model = functional()
        model.compile(optimizer=CFG.wrap_optimizer(keras.optimizers.Adam(1e-2)),
                      loss="sparse_categorical_crossentropy", **CFG.compile_kwargs())
        history = model.fit(x, y, epochs=3, batch_size=16, verbose=0)
    losses = [float(v) for v in history.history["loss"]]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert isinstance(model.optimizer, FlooredLossScaleOptimizer)  # not double-wrapped


def test_fixed_loss_scale_trains_a_model_with_sparse_gradients():
    # An Embedding's gradient is an IndexedSlices; Keras's own loss_scale_factor fails on it.
    cfg = PrecisionConfig("mixed_float16", LossScale("fixed", value=1024.0))
    x = np.random.default_rng(0).integers(0, 50, size=(64, 6))
    y = (x[:, 0] > 25).astype("int32")
    with cfg.scope():
        model = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(50, 8),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
        optimizer = cfg.wrap_optimizer(keras.optimizers.Adam(1e-2))
        model.compile(optimizer=optimizer, **cfg.compile_kwargs(),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, epochs=3, batch_size=16, verbose=0)
    losses = history.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert current_loss_scale(optimizer) == 1024.0
