"""Continuous inputs that 16 bits cannot resolve (a large offset, a small spread): measured in
the diagnostics, caught in a trial before it trains, named in the model's terms."""

from pathlib import Path

import numpy as np
import pytest

from tuner.apply.config import Float32Placement, PrecisionConfig
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec
from tuner.worker.diagnostics.continuous_inputs import NEGLIGIBLE_BELOW, erased_features, negligible
from tuner.worker.trial.trial import run_trial

ROOT = Path(__file__).parent.parent.parent
GEO = str(ROOT / "tests" / "suites" / "quality" / "geo_coordinates.py")
RESIDUAL = ROOT / "tests" / "fixtures" / "tasks" / "raw_residual.py"
# Every task file among the examples and the zoo (the scripts among the examples, which call
# tuner.tune or apply a config, define no train_data()).
TASKS = sorted(str(path.relative_to(ROOT)) for path in
               [*(ROOT / "examples").glob("*.py"),
                *(ROOT / "tests" / "suites" / "zoo").glob("*.py")]
               if not path.name.startswith(("test_", "__"))
               and "\ndef train_data(" in path.read_text())


@pytest.fixture(scope="module")
def geo_diagnostics():
    from tuner.worker.diagnostics.diagnose import diagnose_task

    return diagnose_task(GEO, steps=3)


def _trial(cfg, diagnostics, steps=6):
    spec = TrialSpec(0, GEO, cfg.to_dict(), steps, 2,
                     continuous_inputs=diagnostics["continuous_inputs"])
    return TrialResult.from_dict(run_trial(spec.to_dict()))


# -- the measurement ------------------------------------------------------------------------------
def test_only_features_with_a_large_offset_and_a_small_spread_are_erased():
    rng = np.random.default_rng(0)
    rows = 4096
    table = np.stack([
        rng.uniform(-122.5, -121.8, rows),          # 0: longitude: bfloat16 steps by 0.5 there
        rng.normal(0.0, 1.0, rows),                 # 1: standardized
        rng.integers(0, 2, rows).astype(float),     # 2: a 0/1 flag
        np.full(rows, 290.15),                      # 3: constant
        np.maximum(rng.normal(0.0, 1.0, rows), 0),  # 4: a ReLU's output
        rng.normal(290.0, 0.5, rows),               # 5: kelvin: float16 steps by 0.25 there
        rng.integers(0, 5000, rows).astype(float),  # 6: ids: integer_inputs' business
        np.maximum(rng.normal(0.0, 5e4, rows), 0),  # 7: overflows float16: not rounding
    ], axis=1).astype("float32")
    found = {entry["feature"]: entry for entry in erased_features(table)}
    assert sorted(found) == [0, 5]
    longitude, kelvin = found[0], found[5]
    assert longitude["erased_in"] == ["bfloat16"]
    assert longitude["step"] == {"bfloat16": 0.5, "float16": 0.0625}
    assert longitude["survive"]["bfloat16"] <= 3 and longitude["distinct"] > 4000
    assert longitude["noise"]["bfloat16"] > 0.5 and longitude["noise"]["float16"] < 0.1
    assert longitude["spread"] == pytest.approx(0.7 / np.sqrt(12), rel=0.05)
    assert kelvin["erased_in"] == ["bfloat16", "float16"]


def test_a_feature_float16_zeroes_is_negligible_only_where_float32_drops_it_too():
    rng = np.random.default_rng(0)
    dead_sensor = rng.normal(0.0, 1e-21, 4096)
    (entry,) = erased_features(dead_sensor[:, None])
    assert entry["erased_in"] == ["float16"] and entry["survive"]["float16"] == 1
    # Next to readings of 1000 in the same input: float32 sums it away too.
    assert negligible(entry, input_abs_max=1000.0)
    # A whole input that small (SI units): float16 erases everything the model has. Shown.
    assert not negligible(entry, input_abs_max=3e-21)
    # Above 6e-15 an adapted Normalization (std floored at 1e-7) could lift it to float32's
    # step at 1 or beyond: shown, however large its neighbours.
    (small,) = erased_features(rng.normal(0.0, 1e-10, 4096)[:, None])
    assert small["erased_in"] == ["float16"] and not negligible(small, input_abs_max=1e6)
    assert NEGLIGIBLE_BELOW == pytest.approx(2.0**-24 * 1e-7)


def test_the_residual_regressors_dead_sensor_is_recorded_apart():
    """tests/fixtures/tasks/raw_residual.py: its two inputs of 1e-21 go to ``negligible_inputs`` (no
    candidate, no trial check); tests/records/test_diagnostics_report.py reads the saved
    diagnostics, which this keeps true to what the worker measures."""
    import json

    from tuner.worker.diagnostics.diagnose import diagnose_task

    diagnostics = diagnose_task(str(RESIDUAL), steps=3)
    saved = json.loads(RESIDUAL.with_suffix(".diagnostics.json").read_text())
    zero = diagnostics["negligible_inputs"]
    assert [(e["layer"], e["feature"], e["of_layer"]) for e in zero] == \
        [("stem", 6, 2), ("stem", 7, 2)] == \
        [(e["layer"], e["feature"], e["of_layer"]) for e in saved["negligible_inputs"]]
    assert all(e["input_abs_max"] > 1000 for e in zero)
    assert not any(e["layer"] == "stem" and e["feature"] in (6, 7)
                   for e in diagnostics["continuous_inputs"])

    def counts(found):
        return {e["layer"]: e["of_layer"] for e in found["continuous_inputs"]}

    assert counts(diagnostics) == counts(saved) and len(counts(saved)) == 22
    assert diagnostics["candidates"] == saved["candidates"]
    assert set(diagnostics) == set(saved)


def test_no_trial_fails_on_a_feature_float32_drops_too():
    """mixed_float16 on the residual regressor: the first layer a trial's check stops at is
    block_0, for an offset feature; before, stem, for the dead sensor's 1e-21 (and its repair
    kept stem in float32 for nothing)."""
    import json

    diagnostics = json.loads(RESIDUAL.with_suffix(".diagnostics.json").read_text())
    spec = TrialSpec(0, str(RESIDUAL), PrecisionConfig("mixed_float16").to_dict(), 6, 2,
                     continuous_inputs=diagnostics["continuous_inputs"])
    result = TrialResult.from_dict(run_trial(spec.to_dict()))
    assert result.failure_class is FailureClass.INPUT_ROUNDING, result.failure_message
    assert result.failure_layer == "block_0"
    assert "feature 7 of its inputs (values 1032.8..1040" in result.failure_message


# -- diagnostics ----------------------------------------------------------------------------------
def test_diagnostics_name_the_layer_and_the_coordinates(geo_diagnostics):
    from tuner.records.diagnostics_report import conclusions

    entries = geo_diagnostics["continuous_inputs"]
    assert {(e["layer"], e["class"], e["input"], e["feature"]) for e in entries} == \
        {("normalization", "Normalization", 0, 0), ("normalization", "Normalization", 0, 1)}
    assert all(e["erased_in"] == ["bfloat16"] for e in entries)  # float16 keeps enough of them
    assert geo_diagnostics["candidates"][0] == "normalization"
    assert "normalization (Normalization) receives feature 0 (values -122.5..-121.8, spread " \
        "0.20): bfloat16's step there is 0.5, 2 of 192 distinct values survive, so a bfloat16 " \
        "config must keep normalization in float32" in conclusions(geo_diagnostics)


@pytest.mark.parametrize("task", TASKS)
def test_no_example_or_zoo_model_has_an_erased_input(task):
    from tuner.worker.diagnostics.diagnose import diagnose_task
    from tuner.worker.task.task_loader import load_task

    diagnostics = diagnose_task(str(ROOT / task), steps=3)
    # Taken, not skipped: a diagnostics crash would leave the list empty too.
    loaded = load_task(str(ROOT / task))
    if loaded.loss is None and loaded.compile_model is None:
        assert diagnostics["unavailable"].startswith("the task's LOSS is None")
    else:
        assert "unavailable" not in diagnostics, diagnostics["unavailable"]
    assert diagnostics["continuous_inputs"] == []


def test_where_gradients_cannot_be_traced_the_input_checks_are_still_taken(monkeypatch):
    """A diagnostics failure says what it was and keeps the forward-pass checks: the
    coordinates are still named, and the layer is still a candidate."""
    from tuner.worker.diagnostics import diagnose

    def broken(*args, **kwargs):
        raise RuntimeError("an exotic model the diagnostics cannot trace")

    monkeypatch.setattr(diagnose, "diagnose_model", broken)
    diagnostics = diagnose.diagnose_task(GEO, steps=3)
    assert diagnostics["unavailable"] == "RuntimeError: an exotic model the diagnostics " \
                                         "cannot trace"
    assert {entry["layer"] for entry in diagnostics["continuous_inputs"]} == {"normalization"}
    assert diagnostics["candidates"] == ["normalization"] and diagnostics["layers"] == []


# -- trials ---------------------------------------------------------------------------------------
def _normalized_longitudes(cfg) -> int:
    """How many distinct longitudes the Normalization layer's output holds under ``cfg``."""
    import keras

    from tuner.apply.layers import hook_layer_calls
    from tuner.worker.task.keras_state import reset_keras_state
    from tuner.worker.task.task_loader import load_task

    reset_keras_state(0)
    task = load_task(GEO)
    x = task.train_data()[0][:256]
    outputs = []
    with cfg.scope():
        model = task.build_model()
        with hook_layer_calls(after=lambda layer, output: outputs.append(output)
                              if layer.name == "normalization" else None):
            model(x, training=False)
    return np.unique(keras.ops.convert_to_numpy(outputs[0])[:, 0]).size


def test_mixed_bfloat16_fails_before_training_naming_the_layer(geo_diagnostics):
    cfg = PrecisionConfig("mixed_bfloat16")
    # The premise: Keras casts the float32 longitudes to bfloat16 inside the layer's call.
    assert _normalized_longitudes(cfg) <= 3
    result = _trial(cfg, geo_diagnostics)
    assert result.failure_class is FailureClass.INPUT_ROUNDING, result.failure_message
    assert result.failure_layer == "normalization" and not result.losses
    assert result.failure_message == (
        "input rounding in layer normalization: feature 0 of its inputs (values "
        "-122.5..-121.8, spread 0.20) is cast to bfloat16, whose step there is 0.5: 2 of 192 "
        "distinct values survive; fix: keep normalization in float32 (float32.layers: "
        "[normalization]) or subtract the feature's offset before the model")


def test_keeping_the_layer_in_float32_keeps_the_coordinates_and_trains(geo_diagnostics):
    cfg = PrecisionConfig("mixed_bfloat16", float32=Float32Placement((), ("normalization",)))
    assert _normalized_longitudes(cfg) > 200
    result = _trial(cfg, geo_diagnostics)
    assert result.outcome is TrialOutcome.COMPLETED, result.failure_message
    assert result.failure_class is None and len(result.losses) == 6


def test_a_pure_16_bit_policy_rounds_them_at_the_input(geo_diagnostics):
    cfg = PrecisionConfig("bfloat16", float32=Float32Placement((), ("normalization",)))
    result = _trial(cfg, geo_diagnostics)
    assert result.failure_class is FailureClass.INPUT_ROUNDING, result.failure_message
    assert "arrives as bfloat16 from the model's Input or the layers before it" \
        in result.failure_message
    assert "declare the model's Input with dtype='float32'" in result.failure_message


def test_the_repair_keeps_the_layer_in_float32():
    from tuner.judging.verdict import Judgement, Verdict
    from tuner.records.results import TrialRow
    from tuner.search.proposer import repair_for

    cfg = PrecisionConfig("mixed_bfloat16")
    failed = TrialResult.failed(2, FailureClass.INPUT_ROUNDING, "input rounding ...",
                                "normalization")
    row = TrialRow(2, cfg, failed, Judgement(Verdict.FAILED, "input rounding ...", None, None))
    assert repair_for(row).float32.layers == ("normalization",)


def test_the_plan_carries_them_into_every_trial_spec(geo_diagnostics, tmp_path):
    import pickle

    from tuner.run.plan import RunPlan
    from tuner.run.trial_loop import make_spec
    from tuner.search.space_files import load_space

    space = load_space("quick")
    plan = RunPlan(task_path=Path(GEO), run_dir=tmp_path, space=space, space_ref="quick",
                   trials=4, steps=6, seed=0, tolerance=0.9, exhaustive=False,
                   tracking_uri=None, resume=False).with_diagnostics(geo_diagnostics)
    spec = make_spec(plan, 1, PrecisionConfig("mixed_bfloat16"))
    assert spec.continuous_inputs == geo_diagnostics["continuous_inputs"]
    assert TrialSpec.from_dict(pickle.loads(pickle.dumps(spec.to_dict()))) == spec
