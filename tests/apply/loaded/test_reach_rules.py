"""The rules, as plain data: which dtype is a saved model's own, how a saved dtype entry reads,
and when a config has reached (almost) none of a model, said in one line."""

import pytest

from tuner.apply.dtype_origins import own_dtype, policy_name, saved_layer_dtypes
from tuner.apply.reach import REACH_FLOOR, activation_share, reached_none, unreached_line


@pytest.mark.parametrize("dtypes, own", [
    (["float32"] * 3, "float32"),
    (["mixed_bfloat16", "mixed_bfloat16", "float32"], "mixed_bfloat16"),
    (["mixed_float16", "float32"], "mixed_float16"),      # a tie: a mixed model, placed
    (["int32", "float32"], "float32"),                     # integer layers are not policies
    ([], None),
])
def test_the_saved_models_own_dtype_is_most_of_its_layers(dtypes, own):
    assert own_dtype(dtypes) == own


def test_saved_dtype_entries_read_as_policy_names():
    assert policy_name("float32") == "float32"
    assert policy_name({"class_name": "DTypePolicy", "config": {"name": "mixed_bfloat16"}}) \
        == "mixed_bfloat16"
    assert policy_name({"class_name": "Policy", "config": {"name": "mixed_float16"}}) \
        == "mixed_float16"          # Keras 2's legacy .h5
    assert policy_name({"class_name": "DTypePolicyMap", "config": {}}) is None
    assert policy_name(None) is None


def test_a_configs_layers_are_read_at_any_depth_but_not_its_inputs_or_tensors():
    config = {"layers": [
        {"class_name": "InputLayer", "config": {"dtype": "float32", "name": "in"}},
        {"class_name": "Dense", "config": {"dtype": {"class_name": "DTypePolicy",
                                                     "config": {"name": "float32"}}},
         "inbound_nodes": [{"args": [{"class_name": "__keras_tensor__",
                                      "config": {"dtype": "float32"}}]}]},
        {"class_name": "Functional", "config": {"layers": [
            {"class_name": "Dense", "config": {"dtype": "mixed_bfloat16"}}]}}]}
    assert sorted(saved_layer_dtypes(config)) == ["float32", "mixed_bfloat16"]


def _reach(share, elsewhere=(), layers=None, activations=None):
    return {"dtype": "bfloat16", "parameters": {}, "parameter_share": share,
            "layer_share": layers, "activation_share": activations,
            "elsewhere": list(elsewhere)}


def test_reached_none_is_under_the_floor_of_a_16_bit_config_only():
    assert reached_none(_reach(0.0)) and reached_none(_reach(REACH_FLOOR / 2))
    assert not reached_none(_reach(REACH_FLOOR)) and not reached_none(_reach(None))
    assert not reached_none({**_reach(0.0), "dtype": "float32"})


@pytest.mark.parametrize("parameters, layers, activations, none", [
    (0.0, 0.0, None, True),        # a loaded float32 model, before training
    (0.0, 0.0, 0.01, True),        # ... and after: its activations are float32 too
    (0.01, 0.8, None, False),      # an embedding table kept in float32: the layers compute 16-bit
    (0.01, 0.8, 0.7, False),       # ... and so do the activations
    (0.01, 0.8, 0.02, True),       # the activations say otherwise: they decide over the layers
    (None, 0.0, None, True),       # a model without parameters computing in float32
    (None, None, None, False),     # nothing known yet: not failed on a guess
])
def test_reached_none_needs_both_the_parameters_and_the_computation(parameters, layers,
                                                                      activations, none):
    assert reached_none(_reach(parameters, layers=layers, activations=activations)) is none


def test_the_unreached_line_names_the_layers_their_origin_and_the_fix():
    elsewhere = [{"path": f"dense_{i}", "dtype": "float32", "origin": "outside",
                  "parameters": 100 - i} for i in range(5)]
    line = unreached_line(_reach(0.0, elsewhere, layers=0.0), "mixed_bfloat16")
    assert line.startswith("mixed_bfloat16 reached 0% of the model's parameters and 0% of its "
                           "layers: dense_0, dense_1, dense_2 and 2 more compute in float32")
    assert "before the config's scope opened" in line and "cfg.apply(model)" in line
    assert "\n" not in line


def test_the_activation_share_counts_elements_not_bytes():
    memory = {"activations": {"bfloat16": 200, "float32": 400}}   # 100 and 100 elements
    assert activation_share(memory, "bfloat16") == 0.5
    assert activation_share(None, "bfloat16") is None
