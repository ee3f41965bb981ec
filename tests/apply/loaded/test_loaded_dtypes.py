"""A model the user already has computes in the config's dtype, as its twin built in code does.

Each kind of saved file, config and clone (tests.apply.loaded.saved_kinds), saved by plain Keras in
float32 outside any scope, is loaded under a config's scope the user's way, and compared
layer by layer with the same architecture built in code under that scope: every layer's
compute dtype, every weight's dtype, and the weights themselves (carried over, cast).
"""

import keras
import numpy as np
import pytest

from tests.apply.loaded.saved_kinds import KINDS, save_all, save_mixed_with_float32_softmax
from tuner.apply.config import PrecisionConfig
from tuner.apply.dtype_origins import DtypeOrigin, origin_of
from tuner.apply.layers import layer_paths
from tuner.worker.task.keras_state import reset_keras_state


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved_kinds")
    save_all(folder)
    return folder


def _dtypes(model):
    """(class, compute dtype, variable dtypes) of each layer, in model order."""
    return [(type(layer).__name__, layer.compute_dtype,
             tuple(str(v.dtype) for v in layer._trainable_variables))
            for layer, _ in layer_paths(model)]


def _weights(model):
    return [np.asarray(keras.ops.cast(w.value, "float32")) for w in model.weights]


# mixed_bfloat16 in the quick tier (it alone catches the repair made a no-op); the other two in
# the slow tier, where every kind is loaded under each.
POLICIES = ["mixed_bfloat16", pytest.param("mixed_float16", marks=pytest.mark.slow),
            pytest.param("bfloat16", marks=pytest.mark.slow)]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_loaded_model_computes_like_its_twin_built_in_code(saved, name, policy):
    kind = KINDS[name]
    if policy == "bfloat16" and not kind.pure:
        pytest.skip("Keras's LSTM cannot initialise bfloat16 weights (its orthogonal "
                    "initializer's QR has no bfloat16 kernel), built in code or loaded")
    reset_keras_state(0)
    cfg = PrecisionConfig(policy)
    with cfg.scope():
        loaded = kind.load(saved)
        twin = kind.twin()
    if not loaded.built:
        loaded(kind.inputs()[:2])
    assert _dtypes(loaded) == _dtypes(twin)
    with_weights = [layer for layer, _ in layer_paths(loaded) if layer._trainable_variables]
    assert with_weights and {layer.compute_dtype for layer in with_weights} \
        == {cfg.compute_dtype}
    # The saved weights came along (cast), not fresh ones: the float32 original agrees.
    reset_keras_state(0)
    with PrecisionConfig().scope():
        original = kind.load(saved)
    if not original.built:
        original(kind.inputs()[:2])
    if name.endswith(("_clone", "_json")):
        return  # clone_model and model_from_json make fresh weights by design (Keras's own)
    rounding = 1e-2 if cfg.compute_dtype == "bfloat16" and policy in ("bfloat16",) else 1e-3
    for ours, theirs in zip(_weights(loaded), _weights(original)):
        np.testing.assert_allclose(ours, theirs, atol=rounding * (1 + np.abs(theirs).max()))


# Each case is saved in another policy than the one it loads under, so that it needs the scope's
# repair (the saved model's own dtype replaced) beside its keep (the float32 softmax left alone):
# with the repair made a no-op, every case fails.
@pytest.mark.parametrize("saved_policy, policy, other_layers", [
    ("mixed_float16", "mixed_bfloat16", "bfloat16"),
    ("mixed_bfloat16", "mixed_float16", "float16"),
    ("mixed_float16", "bfloat16", "bfloat16"),
])
def test_a_saved_mixed_models_float32_softmax_stays_float32(tmp_path, saved_policy, policy,
                                                             other_layers):
    path = save_mixed_with_float32_softmax(tmp_path, saved_policy)
    reset_keras_state(0)
    with PrecisionConfig(policy).scope():
        model = keras.models.load_model(path, compile=False)
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    assert dense[-1].compute_dtype == "float32"          # the saved placement
    assert origin_of(dense[-1]) is DtypeOrigin.SAVED_KEPT
    assert {layer.compute_dtype for layer in dense[:-1]} == {other_layers}
    assert {origin_of(layer) for layer in dense[:-1]} == {DtypeOrigin.SAVED}
    assert model.layers[2].inner.compute_dtype == other_layers  # passed down in the custom layer


def test_a_model_saved_in_float16_takes_bfloat16(tmp_path):
    keras.config.set_dtype_policy("mixed_float16")
    try:
        inputs = keras.Input((4,))
        keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(8)(inputs))).save(
            tmp_path / "f16.keras")
    finally:
        keras.config.set_dtype_policy("float32")
    with PrecisionConfig("mixed_bfloat16").scope():
        model = keras.models.load_model(tmp_path / "f16.keras")
    assert [layer.compute_dtype for layer in model.layers[1:]] == ["bfloat16", "bfloat16"]


def test_a_layers_own_dtype_in_code_is_kept_and_said(saved):
    with PrecisionConfig("mixed_bfloat16").scope():
        inputs = keras.Input((8,))
        head = keras.layers.Dense(3, dtype="float32")
        model = keras.Model(inputs, head(keras.layers.Dense(4)(inputs)))
    assert head.compute_dtype == "float32" and origin_of(head) is DtypeOrigin.CODE
    assert model.layers[1].compute_dtype == "bfloat16"
    assert origin_of(model.layers[1]) is DtypeOrigin.POLICY


def test_outside_any_scope_keras_keeps_the_saved_dtype(saved):
    # The control: the scope's rule is the scope's; plain Keras still loads as saved.
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = keras.models.load_model(saved / "functional.keras", compile=False)
    finally:
        keras.config.set_dtype_policy("float32")
    assert model.layers[1].compute_dtype == "float32"


# -- cfg.apply(model): a model already in memory ------------------------------------------------
def test_apply_changes_a_loaded_model_in_place_under_a_mixed_policy(saved):
    reset_keras_state(0)
    model = keras.models.load_model(saved / "functional.keras", compile=False)
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(KINDS["functional_keras"].inputs(), np.zeros(64, "int32"), verbose=0)
    cfg = PrecisionConfig.from_dict({"policy": "mixed_bfloat16",
                                     "float32": {"groups": ["softmax"]}})
    applied = cfg.apply(model)
    assert applied is model
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    assert [layer.compute_dtype for layer in dense] == ["bfloat16", "float32"]  # softmax placed
    assert model.layers[2].inner.compute_dtype == "bfloat16"
    captured = []
    from tuner.apply.layers import hook_layer_calls

    with hook_layer_calls(after=lambda layer, out: captured.append((layer.name, out.dtype))):
        # The compiled model retraces with the new dtypes (the hook sees the trace's tensors).
        model.fit(KINDS["functional_keras"].inputs(), np.zeros(64, "int32"), verbose=0)
    seen = {name: str(getattr(dtype, "name", dtype)) for name, dtype in captured}
    assert seen[dense[0].name] == "bfloat16" and seen[dense[1].name] == "float32"


def test_apply_rebuilds_for_pure_bfloat16_with_the_weights(saved):
    reset_keras_state(0)
    for name in ("functional_keras", "subclassed_keras"):
        model = KINDS[name].load(saved)
        rebuilt = PrecisionConfig("bfloat16").apply(model)
        assert rebuilt is not model
        assert {str(w.dtype) for w in rebuilt.weights} == {"bfloat16"}
        assert {str(w.dtype) for w in model.weights} == {"float32"}   # left as it was
        for ours, theirs in zip(_weights(rebuilt), _weights(model)):
            np.testing.assert_allclose(ours, theirs, atol=1e-2 * (1 + np.abs(theirs).max()))


def test_apply_refuses_what_is_not_a_model_in_one_line():
    from tuner.errors import ConfigError

    with pytest.raises(ConfigError, match=r"cfg.apply\(\) takes a keras.Model. Received: "
                                          r"model='mlp.keras' \(of type str\)"):
        PrecisionConfig("mixed_bfloat16").apply("mlp.keras")
