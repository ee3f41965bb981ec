"""The model's ceiling figure: timed with its noise, kept in the machine's cache by its shape,
and read back from there, as a user's machine reads its own figures (a cache file written with
an AVX2-only CPU's figures makes this machine answer as that one would)."""

import json
import time

from tuner.judging.ceiling_limit import ruled_out


def test_the_model_figure_is_kept_by_shape_and_read_back(monkeypatch, tmp_path):
    from tuner.worker.device import ceiling, ceiling_cache

    monkeypatch.setenv("PRECISION_TUNER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ceiling, "_measured", {})
    layer = {"layer": "dense", "shape": [8, 64, 64]}
    first = ceiling.measure_ceiling(layer)["model"]
    assert "kept" not in first and first["layer"] == "dense"
    assert set(first["spread"]) == set(first["speed"]) and first["spread"]["float32"] == 0.0
    assert all(value >= 0.0 for value in first["spread"].values())
    again = ceiling.measure_ceiling(layer)["model"]
    assert again["kept"] is True and again["speed"] == first["speed"]
    key = ceiling_cache.machine_key("CPU")
    kept = json.loads((tmp_path / "ceiling.json").read_text())[key]["figures"]
    assert kept["models"]["8x64x64"]["speed"] == first["speed"]
    # The device's figures a job reads carry no other model's.
    assert "models" not in ceiling.measure_ceiling(layer)
    # Re-timed device figures (a fresh probe) drop the models kept with the old ones.
    ceiling.measure_ceiling(fresh=True)
    assert "models" not in json.loads((tmp_path / "ceiling.json").read_text())[key]["figures"]


def test_a_cache_with_slow_16bit_figures_answers_as_that_machine_would(monkeypatch, tmp_path):
    from tuner.worker.device import ceiling, ceiling_cache

    monkeypatch.setenv("PRECISION_TUNER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ceiling, "_measured", {})
    slow = {"float32": 1.0, "bfloat16": 0.9, "float16": 0.88}
    figures = {"device": "CPU", "size": 256, "ms": {"float32": 1.0, "bfloat16": 1.25,
                                                     "float16": 1.4},
               "speed": {"float32": 1.0, "bfloat16": 0.8, "float16": 0.7},
               "measured_at": "2026-12-06 12:00:00",
               "peak": {"size": 1024, "speed": {"float32": 1.0, "bfloat16": 0.83,
                                                "float16": 0.94}},
               "models": {"8x64x64": {"speed": slow, "spread": dict.fromkeys(slow, 0.02)}}}
    key = ceiling_cache.machine_key("CPU")
    (tmp_path / "ceiling.json").write_text(json.dumps({key: {"taken": time.time(),
                                                             "figures": figures}}))
    read = ceiling.measure_ceiling({"layer": "dense", "shape": [8, 64, 64]})
    assert read["model"]["speed"] == slow and read["peak"]["speed"]["bfloat16"] == 0.83
    assert set(ruled_out(read, 0.03)) == {"bfloat16", "float16"}
