"""Trials of a model the user already has train in the config's dtype, and say so.

Real trials (tuner.worker.trial.trial, in this process) of task files whose ``build_model()``
loads a saved model, beside the twin built in code: the memory record's activations are 16-bit,
the recorded reach is the whole model. A config that reaches no layer (layers built with
``dtype="float32"``, a model loaded before the scope opened) fails as ``precision_unreached``
with the layers, where their dtype came from and the fix, in one line. A model file that does
not load stops the task check with one line naming the file, the cause and the fix.
"""

import keras
import numpy as np
import pytest

from tests.apply.loaded.saved_kinds import KINDS, save_all, task_file
from tuner.apply.config import PrecisionConfig
from tuner.errors import TaskError
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec
from tuner.worker.check.task_check import check_task
from tuner.worker.trial.trial import run_trial

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved_for_trials")
    save_all(folder)
    return folder


def _trial(path, cfg, steps=6):
    spec = TrialSpec(0, str(path), cfg.to_dict(), steps, 2)
    return TrialResult.from_dict(run_trial(spec.to_dict()))


def _activation_dtypes(result):
    return {dtype for dtype, size in result.training_memory["activations"].items() if size}




@pytest.mark.parametrize("name", ["functional_keras", "functional_h5", "subclassed_keras",
                                  "attention_keras"])
def test_a_loaded_models_mixed_trial_computes_in_bfloat16(saved, name):
    result = _trial(task_file(saved, name), PrecisionConfig("mixed_bfloat16"))
    assert result.outcome is TrialOutcome.COMPLETED, result.failure_message
    activations = result.training_memory["activations"]
    assert activations.get("bfloat16", 0) > 0.9 * sum(activations.values()), activations
    assert result.precision_reach["parameter_share"] == 1.0
    assert result.precision_reach["activation_share"] > 0.9


def test_the_loaded_model_and_its_twin_record_the_same(saved, tmp_path):
    twin = tmp_path / "twin.py"
    twin.write_text(task_file(saved, "functional_keras").read_text().replace(
        "return keras.models.load_model(HERE / 'functional.keras', compile=False)",
        "from tests.apply.loaded.saved_kinds import functional\n    return functional()"))
    cfg = PrecisionConfig("mixed_bfloat16")
    loaded, built = _trial(task_file(saved, "functional_keras"), cfg), _trial(twin, cfg)
    assert loaded.training_memory["activations"] == built.training_memory["activations"]
    assert loaded.training_memory["weights"] == built.training_memory["weights"]
    assert loaded.precision_reach["parameters"] == built.precision_reach["parameters"]


def test_pure_bfloat16_on_a_loaded_model_trains_16_bit_weights(saved):
    path = task_file(saved, "functional_keras")
    results = {update: _trial(path, PrecisionConfig.from_dict(
        {"policy": "bfloat16", "weight_update": update}), steps=8)
        for update in ("stochastic", "nearest")}
    for result in results.values():
        assert result.outcome is TrialOutcome.COMPLETED, result.failure_message
        assert set(result.training_memory["weights"]) == {"bfloat16"}
        assert _activation_dtypes(result) == {"bfloat16"}
    # The weight update applies to the loaded model's 16-bit weights (it leaves float32 ones
    # alone, where both would train alike).
    assert results["stochastic"].losses != results["nearest"].losses


def test_layers_built_with_float32_in_code_fail_as_unreached(saved):
    path = task_file(saved, "code_float32", expression=(
        "keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, dtype='float32'), "
        "keras.layers.Dense(3, activation='softmax', dtype='float32')])"))
    result = _trial(path, PrecisionConfig("mixed_bfloat16"))
    assert result.failure_class is FailureClass.PRECISION_UNREACHED
    message = result.failure_message
    assert "mixed_bfloat16 reached 0% of the model's parameters" in message
    assert "dense" in message and "dtype='float32' in the code" in message
    assert "Fix: construct them without dtype=" in message and "\n" not in message
    assert not result.losses   # told before training: nothing was timed as a 16-bit config
    float32 = _trial(path, PrecisionConfig())
    assert float32.outcome is TrialOutcome.COMPLETED   # float32 is not judged on its reach


def test_a_model_loaded_before_the_scope_fails_as_unreached_with_its_fix(saved, tmp_path):
    path = tmp_path / "import_time.py"
    path.write_text(task_file(saved, "functional_keras").read_text().replace(
        "def build_model():\n    return keras.models.load_model(HERE / 'functional.keras', "
        "compile=False)",
        f"MODEL = keras.models.load_model({str(saved / 'functional.keras')!r}, compile=False)\n"
        "def build_model():\n    return MODEL"))
    result = _trial(path, PrecisionConfig("mixed_bfloat16"))
    assert result.failure_class is FailureClass.PRECISION_UNREACHED, result.failure_message
    assert "before the config's scope opened" in result.failure_message
    assert "cfg.apply(model)" in result.failure_message


def test_a_keras_hub_model_from_a_local_preset_takes_the_policy(tmp_path):
    # The control the issue names: KerasHub's from_preset already takes the scope's policy.
    keras_hub = pytest.importorskip("keras_hub")
    keras.config.set_dtype_policy("float32")
    backbone = keras_hub.models.BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16,
                                             max_sequence_length=8)
    backbone.save_to_preset(tmp_path / "preset")
    from tuner.apply.layers import layer_paths

    for policy, weights in (("mixed_bfloat16", "float32"), ("bfloat16", "bfloat16")):
        with PrecisionConfig(policy).scope():
            loaded = keras_hub.models.Backbone.from_preset(str(tmp_path / "preset"))
        assert {layer.compute_dtype for layer, _ in layer_paths(loaded)
                if layer._trainable_variables} == {"bfloat16"}
        assert {str(w.dtype) for w in loaded.weights} == {weights}


# -- a model file that does not load: one line, before any trial ------------------------------
def _probe_error(saved, expression):
    path = task_file(saved, f"bad_{abs(hash(expression))}", expression=expression)
    with pytest.raises(TaskError) as caught:
        check_task(str(path), steps=2)
    message = str(caught.value)
    assert "\n" not in message and "Fix:" in message
    return message


def test_a_missing_model_file_is_named(saved):
    message = _probe_error(saved, "keras.models.load_model(HERE / 'nope.keras')")
    assert f"could not load the model file {saved / 'nope.keras'}: no such file" in message


def test_an_unregistered_custom_layer_is_named(saved, tmp_path):
    # Saved with a custom class that the task never defines or imports.
    class Doubler(keras.layers.Layer):
        def call(self, x):
            return 2 * x

    inputs = keras.Input((8,))
    keras.Model(inputs, keras.layers.Dense(3)(Doubler()(inputs))).save(saved / "unknown.keras")
    message = _probe_error(saved, "keras.models.load_model(HERE / 'unknown.keras')")
    assert "it uses the custom class 'Doubler', which is not registered" in message
    assert "register_keras_serializable" in message


def test_a_keras_2_saved_model_directory_is_named(saved):
    import tensorflow as tf

    module = tf.Module()
    module.v = tf.Variable(1.0)
    tf.saved_model.save(module, str(saved / "exported"))
    message = _probe_error(saved, "keras.models.load_model(HERE / 'exported')")
    assert "is a TensorFlow SavedModel directory (Keras 2)" in message


def test_the_guard_says_when_its_config_reaches_no_layer(saved):
    model = keras.models.load_model(saved / "functional.keras", compile=False)  # before scope
    cfg = PrecisionConfig("mixed_bfloat16")
    guard = cfg.guard(verbose=0)
    model.compile(optimizer=cfg.wrap_optimizer(keras.optimizers.Adam()),
                  loss="sparse_categorical_crossentropy")
    model.fit(KINDS["functional_keras"].inputs(), np.zeros(64, "int32"), verbose=0,
              callbacks=[guard])
    kinds = [event.kind for event in guard.events]
    assert kinds == ["precision_unreached"]
    assert "cfg.apply(model)" in guard.events[0].seen
    # Applied, the same model is reached and the guard has nothing to say.
    model = cfg.apply(model)
    guard = cfg.guard(verbose=0)
    model.fit(KINDS["functional_keras"].inputs(), np.zeros(64, "int32"), verbose=0,
              callbacks=[guard])
    assert guard.events == []
