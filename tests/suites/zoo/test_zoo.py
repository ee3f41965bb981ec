"""The zoo: task files written the way the Keras guides and common projects write them.

Every float32 group reaches exactly the layers it selects in every zoo model, and every zoo
model trains in a trial, in float32 and in a 16-bit policy.
"""

import math
from pathlib import Path

import keras
import pytest

from tuner.apply.config import FLOAT32_GROUPS, Float32Placement, PrecisionConfig
from tuner.apply.layers import float32_matches, layer_paths
from tuner.trial_types import TrialOutcome, TrialResult, TrialSpec
from tuner.worker.task.keras_state import reset_keras_state
from tuner.worker.task.task_loader import fixed_batches, load_task
from tuner.worker.trial.trial import run_trial

ZOO = Path(__file__).parent
MODELS = sorted(path.stem for path in ZOO.glob("*.py")
                if not path.stem.startswith(("test_", "_")))
# What a 16-bit trial of each model needs beyond float32 softmax: add_loss's regularization
# term must not be 16-bit next to the float32 weight-decay term Keras sums it with;
# float_token_ids: its ids come as floats, which 16-bit would round (see test_reasons);
# custom_metric: its metric subtracts the predictions from float32 targets, which needs float32
# outputs (``model.fit`` fails without them too: test_keras_apply).
EXTRA_FLOAT32_LAYERS = {"add_loss": ("activity_regularization",),
                        "float_token_ids": ("token_embedding",),
                        "vae": ("sampling",)}    # float32 noise for a 16-bit mean
FLOAT32_OUTPUTS = {"custom_metric"}
# Models that fail to build at all in 16 bits without their EXTRA_FLOAT32_LAYERS.
BUILT_ONLY_WITH_EXTRA = {"vae"}


def test_the_zoo_is_all_there():
    assert {"guide_train_step", "sample_weights", "multi_io", "add_loss", "bidirectional_rnn",
            "conv_batchnorm", "transformer", "time_distributed", "nested_model",
            "custom_layer", "custom_metric", "vae"} <= set(MODELS)


def _built(name, cfg):
    """The zoo model built under ``cfg.scope()``; a subclassed one called after the scope, as a
    user's script would."""
    reset_keras_state(0)
    task = load_task(str(ZOO / f"{name}.py"))
    with cfg.scope():
        model = task.build_model()
    if not model.built:
        x, _, _ = keras.utils.unpack_x_y_sample_weight(fixed_batches(task, 1)[0])
        model(x)
    return model


def _should_be_float32(model, selected):
    """Paths that compute in float32 when ``selected`` are placed: each selected layer, what is
    inside it, and a wrapper (TimeDistributed) around one, with what is inside that."""
    pairs = layer_paths(model)
    roots = set(selected)
    roots |= {path for layer, path in pairs if isinstance(layer, keras.layers.Wrapper)
              and any(inner == f"{path}/{layer.layer.name}" for inner in selected)}
    return {path for _, path in pairs
            if any(path == root or path.startswith(root + "/") for root in roots)}


@pytest.fixture(scope="module")
def zoo_matches():
    return {name: float32_matches(_built(name, PrecisionConfig()), FLOAT32_GROUPS)
            for name in MODELS}


def _group_configs(extra=()):
    """One config per group, and one with all of them; each also keeps ``extra`` (a model's
    EXTRA_FLOAT32_LAYERS, where it cannot even be built in 16 bits without them)."""
    return [PrecisionConfig("mixed_float16", float32=Float32Placement((group,), extra))
            for group in FLOAT32_GROUPS] + \
        [PrecisionConfig("mixed_bfloat16", float32=Float32Placement(FLOAT32_GROUPS, extra))]


@pytest.mark.parametrize("name", MODELS)
def test_each_group_places_exactly_the_layers_it_selects(name, zoo_matches):
    extra = EXTRA_FLOAT32_LAYERS.get(name, ())
    for cfg in _group_configs(extra if name in BUILT_ONLY_WITH_EXTRA else ()):
        model = _built(name, cfg)
        selected = [path for group in cfg.float32.groups
                    for path in zoo_matches[name]["groups"][group]]
        selected += [path for layer, path in layer_paths(model)
                     if layer.name in cfg.float32.layers]
        expected = _should_be_float32(model, selected)
        for layer, path in layer_paths(model):
            wanted = "float32" if path in expected else cfg.compute_dtype
            assert layer.dtype_policy.compute_dtype == wanted, (cfg.describe(), path)


def test_a_float32_group_inside_the_models_own_ops_trains():
    # The Keras example's transformer block adds `out1 + ffn_output` (out1 from a
    # LayerNormalization) with Python's `+`: the float32 normalization hands its output back in
    # the block's 16-bit dtype, so the add works and the model trains.
    cfg = PrecisionConfig("mixed_float16", float32=Float32Placement(("normalization",)))
    result = _trial("transformer", cfg, steps=3)
    assert result.outcome is TrialOutcome.COMPLETED, result.failure_message


# -- real training -------------------------------------------------------------------------------
def _trial(name, cfg, steps=8):
    spec = TrialSpec(0, str(ZOO / f"{name}.py"), cfg.to_dict(), steps, 2)
    return TrialResult.from_dict(run_trial(spec.to_dict()))


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_each_model_trains_in_float32_and_in_bfloat16(name):
    placement = Float32Placement(("softmax",), EXTRA_FLOAT32_LAYERS.get(name, ()),
                                 name in FLOAT32_OUTPUTS)
    for cfg in (PrecisionConfig(), PrecisionConfig("mixed_bfloat16", float32=placement)):
        result = _trial(name, cfg)
        assert result.outcome is TrialOutcome.COMPLETED, (cfg.describe(), result.failure_message)
        assert len(result.losses) == 8 and all(math.isfinite(v) for v in result.losses)


@pytest.mark.slow
def test_a_16_bit_add_loss_fails_as_under_keras_fit():
    # Raw Keras `fit` fails the same way under mixed_bfloat16 (Keras sums the layer's 16-bit
    # add_loss term with float32 ones); the trial must report it, not hide it. Placing the
    # layer that calls add_loss in float32 fixes it (EXTRA_FLOAT32_LAYERS, trained above).
    broken = _trial("add_loss", PrecisionConfig("mixed_bfloat16"), steps=4)
    assert broken.outcome is TrialOutcome.FAILED and "bfloat16" in broken.failure_message
