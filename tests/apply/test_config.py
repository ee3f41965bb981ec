import json

import pytest

from tuner.apply.config import Epsilon, Float32Placement, LossScale, PrecisionConfig
from tuner.errors import ConfigError

FULL = PrecisionConfig("mixed_float16", LossScale("dynamic", 256.0, 200, None, 2.0),
                       Epsilon(1e-4, 1e-3), Float32Placement(("normalization", "softmax"),
                                                             ("dense_2", "block_*")))


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_round_trip_through_files(tmp_path, suffix):
    path = FULL.save(tmp_path / f"cfg{suffix}")
    loaded = PrecisionConfig.load(path)
    assert loaded == FULL
    assert loaded.to_dict() == FULL.to_dict()


def test_dict_round_trip_keeps_every_field():
    data = FULL.to_dict()
    assert data["schema_version"] == 1
    assert data["loss_scale"] == {"kind": "dynamic", "initial_scale": 256.0, "growth_steps": 200,
                                  "value": None, "floor": 2.0}
    assert PrecisionConfig.from_config(FULL.get_config()) == FULL


def test_defaults_are_plain_float32():
    cfg = PrecisionConfig.from_dict({})
    assert cfg.policy == "float32" and cfg.loss_scale.kind == "none"
    assert cfg.float32.groups == () and cfg.epsilon.backend is None


@pytest.mark.parametrize("data, fragment", [
    ({"policy": "fp8"}, "policy='fp8'"),
    ({"polcy": "float32"}, "unknown key 'polcy'"),
    ({"loss_scale": {"kind": "dynamic", "extra": 1}, "policy": "mixed_float16"},
     "unknown key loss_scale.'extra'"),
    ({"policy": "mixed_float16", "loss_scale": {"kind": "fixed", "value": -4}}, "value=-4"),
    ({"policy": "mixed_float16", "loss_scale": {"kind": "fixed"}}, "loss_scale.value"),
    ({"policy": "mixed_float16", "loss_scale": {"kind": "dynamic", "initial_scale": 0}},
     "initial_scale=0"),
    ({"policy": "mixed_bfloat16", "loss_scale": {"kind": "dynamic"}}, "only applies where"),
    ({"epsilon": {"backend": "tiny"}}, "backend='tiny'"),
    ({"float32": {"groups": ["convolution"]}}, "groups='convolution'"),
    ({"float32": {"outputs": "yes"}}, "outputs='yes'"),
    ({"schema_version": 99}, "newer than"),
])
def test_invalid_configs_are_rejected_with_the_bad_value(data, fragment):
    with pytest.raises(ConfigError) as info:
        PrecisionConfig.from_dict(data, source="my.json")
    message = str(info.value)
    assert message.startswith("my.json")
    assert fragment in message
    assert "\n" not in message


def test_load_rejects_broken_json_and_missing_files(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot parse"):
        PrecisionConfig.load(broken)
    with pytest.raises(ConfigError, match="not found"):
        PrecisionConfig.load(tmp_path / "absent.json")


def test_save_refuses_to_overwrite_and_writes_atomically(tmp_path):
    path = tmp_path / "best.json"
    path.write_text("precious")
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        FULL.save(path)
    assert path.read_text() == "precious"
    FULL.save(path, overwrite=True)
    assert json.loads(path.read_text())["policy"] == "mixed_float16"
    assert [p.name for p in tmp_path.iterdir()] == ["best.json"]


def test_describe_is_readable():
    assert FULL.describe() == ("mixed_float16 · dynamic 2^8 · eps 0.0001 opt-eps 0.001 · "
                               "f32: norm,softmax,dense_2,block_*")
    assert PrecisionConfig("mixed_bfloat16").describe() == "mixed_bfloat16"


def test_provenance_is_kept_but_not_part_of_equality():
    with_info = PrecisionConfig.from_dict({**FULL.to_dict(), "provenance": {"speedup": 2.0}})
    assert with_info == FULL
    assert with_info.to_dict()["provenance"] == {"speedup": 2.0}


def test_float32_outputs_round_trip_and_read_in_the_description():
    cfg = PrecisionConfig("mixed_bfloat16", float32=Float32Placement(("softmax",), (), True))
    assert cfg.to_dict()["float32"] == {"groups": ["softmax"], "layers": [], "outputs": True}
    assert PrecisionConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.describe() == "mixed_bfloat16 · f32: softmax,outputs"
    # A config written before the field existed loads with float32 outputs off.
    assert PrecisionConfig.from_dict({"policy": "mixed_bfloat16",
                                      "float32": {"groups": [], "layers": []}}).float32.outputs \
        is False

