"""``TuneResult.trials``: one row per trial, with a column per searched config dimension."""

from tuner.api.result import TuneResult
from tuner.apply.config import LossScale, PrecisionConfig
from tuner.records.run_store import RunStore


def test_each_searched_dimension_has_its_column_empty_where_it_does_not_apply(tmp_path):
    configs = [PrecisionConfig("float32"),
               PrecisionConfig("mixed_float16", loss_scale=LossScale("dynamic")),
               PrecisionConfig("bfloat16", weight_update="compensated")]
    store = RunStore(tmp_path)
    for number, config in enumerate(configs):
        store.append_trial({"number": number, "config": config.to_dict(), "verdict": "stable"})
    frame = TuneResult(tmp_path).trials
    assert frame["policy"].tolist() == ["float32", "mixed_float16", "bfloat16"]
    assert frame["loss_scale"].fillna("-").tolist() == ["-", "dynamic", "-"]
    assert frame["weight_update"].fillna("-").tolist() == ["-", "-", "compensated"]


def test_each_trial_says_how_much_of_the_model_its_16_bit_dtype_reached(tmp_path):
    store = RunStore(tmp_path)
    reaches = [{"dtype": "float32", "parameter_share": 1.0, "activation_share": 1.0},
               {"dtype": "bfloat16", "parameter_share": 0.98, "activation_share": 0.9},
               {"dtype": "bfloat16", "parameter_share": 0.0, "activation_share": None}]
    for number, (policy, reach) in enumerate(zip(["float32", "mixed_bfloat16", "bfloat16"],
                                                 reaches)):
        store.append_trial({"number": number, "config": PrecisionConfig(policy).to_dict(),
                            "verdict": "stable", "result": {"precision_reach": reach}})
    frame = TuneResult(tmp_path).trials
    assert frame["reach_parameters"].fillna(-1).tolist() == [-1, 0.98, 0.0]
    assert frame["reach_activations"].fillna(-1).tolist() == [-1, 0.9, -1]
