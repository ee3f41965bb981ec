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
