"""Targets the model must learn to output: read in the diagnostics before any trial, the output
layer named, and kept in float32 in every config whose compute dtype cannot produce them."""

from pathlib import Path

import numpy as np
import pytest

from tuner.records.diagnostics_report import conclusions
from tuner.search.space_files import load_space
from tuner.worker.diagnostics.output_targets import _elementwise, _needs_float32

ROOT = Path(__file__).parent.parent.parent
HOUSES = str(ROOT / "examples" / "house_prices.py")


def test_range_and_resolution_decide_which_compute_dtypes_need_a_float32_head():
    rng = np.random.default_rng(0)
    dollars = rng.uniform(1.2e5, 3.7e5, 4096)
    assert list(_needs_float32(dollars)) == ["float16"]          # past float16's range
    assert "targets up to 3.7e+05 pass float16's 65504 / 4" in _needs_float32(dollars)["float16"]
    assert list(_needs_float32(rng.normal(0.0, 1.0, 4096))) == []  # standardized: nothing
    assert list(_needs_float32(rng.uniform(0.0, 1.6e4, 4096))) == []   # inside the headroom
    kelvin = _needs_float32(rng.normal(290.0, 0.5, 4096))       # a large offset, a small spread
    assert sorted(kelvin) == ["bfloat16", "float16"]
    assert "bfloat16's step at the targets' typical 290 is 2" in kelvin["bfloat16"]
    # Only outputs compared with their targets value by value: a classifier's sparse labels
    # are indices, not values it produces.
    assert _elementwise((32, 1), (32,)) and _elementwise((32, 4), (32, 4))
    assert not _elementwise((32, 10), (32,)) and not _elementwise((32, 1), (32, 3))


@pytest.fixture(scope="module")
def houses():
    from tuner.worker.diagnostics.diagnose import diagnose_task

    return diagnose_task(HOUSES, steps=3)


def test_a_dollar_valued_regression_names_its_head_for_float16_only(houses):
    [head] = houses["output_heads"]
    assert (head["layer"], head["layers"], head["output"]) == ("price", ["price"], 0)
    assert list(head["needs_float32_in"]) == ["float16"] and head["max"] > 3e5
    assert houses["candidates"][0] == "price"
    assert any(line.startswith("output 0 (price, Dense) must produce targets ")
               and line.endswith("so every float16 config keeps price in float32")
               for line in conclusions(houses))


def test_a_head_without_weights_is_kept_with_the_layer_that_feeds_it(tmp_path):
    from tuner.worker.diagnostics.diagnose import diagnose_task

    task = tmp_path / "scaled_head.py"
    task.write_text('''
import keras
import numpy as np

BATCH_SIZE = 64
LOSS = "mse"


def build_model():
    inputs = keras.Input(shape=(4,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    score = keras.layers.Dense(1, name="score")(hidden)
    return keras.Model(inputs, keras.layers.Rescaling(1e5, name="to_dollars")(score))


def train_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype("float32")
    return x, (2.5e5 + 5e4 * x[:, 0]).astype("float32")
''')
    [head] = diagnose_task(str(task), steps=2)["output_heads"]
    assert head["layer"] == "to_dollars" and head["layers"] == ["score", "to_dollars"]


def test_a_classifier_has_no_head_to_keep():
    from tuner.worker.diagnostics.diagnose import diagnose_task

    assert diagnose_task(str(ROOT / "examples" / "digits_mlp.py"), steps=2)["output_heads"] == []


def test_no_float16_config_of_the_search_has_the_head_in_float16(houses):
    space = load_space("default").with_diagnostics(houses["candidates"],
                                                   houses["loss_scale"]["initial_scale"],
                                                   houses["output_heads"])
    configs = list(space.grid())
    float16 = [c for c in configs if c.compute_dtype == "float16"]
    assert float16 and all("price" in c.float32.layers for c in float16)
    # bfloat16 produces these targets: its configs place the head only where searched.
    assert any("price" not in c.float32.layers for c in configs if c.compute_dtype == "bfloat16")
