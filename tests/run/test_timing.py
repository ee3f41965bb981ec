"""Where the wall time went: the breakdown's arithmetic and its one-line form."""

import pytest

from tuner.records.timing import TimeBreakdown, describe_ceiling
from tuner.trial_types import TrialOutcome, TrialResult


def _result(setup, trace, train, wall):
    return TrialResult(number=0, outcome=TrialOutcome.COMPLETED, setup_s=setup, trace_s=trace,
                       train_s=train, wall_s=wall)


def test_phases_and_worker_parts_add_up():
    clock = TimeBreakdown()
    clock.add("start-up", 4.0)
    clock.add("trials", 10.0)
    clock.add("trials", -1.0)  # a clock never runs backwards into a phase
    clock.workers["trials"].add(_result(1.0, 2.0, 3.0, 6.5))
    clock.workers["trials"].add(_result(1.0, 2.0, 3.0, 6.0))
    clock.workers["trials"].record_s += 0.25
    worker = clock.workers["trials"]
    assert (worker.runs, worker.build_s, worker.trace_s, worker.train_s) == (2, 2.0, 4.0, 6.0)
    assert worker.other_s == pytest.approx(0.5)
    assert clock.other_s(20.0) == pytest.approx(6.0)
    line = clock.describe(20.0)
    assert line == ("where the time went: start-up 4.0 s · trials 10.0 s (2 runs, 2 traced: "
                    "build 2.0, trace 4.0, train 6.0, worker other 0.5, records 0.2) · "
                    "other 6.0 s")
    metrics = clock.metrics(20.0)
    assert metrics["time_trials_s"] == 10.0 and metrics["time_trials_trace_s"] == 4.0
    assert metrics["time_re_measurement_build_s"] == 0.0 and metrics["time_other_s"] == 6.0
    assert clock.to_dict(20.0)["workers"]["trials"]["runs"] == 2
    # timing.json gives back the same breakdown (the benchmark prints it from there).
    import json
    again = TimeBreakdown.from_dict(json.loads(json.dumps(clock.to_dict(20.0))))
    assert again.describe(20.0) == line


def test_validations_first_batch_that_traces_the_test_step_counts_as_tracing():
    clock = TimeBreakdown()
    validated = _result(1.0, 2.0, 3.0, 7.0)
    validated.validation = {"loss": 0.5, "seconds": 0.75, "trace_seconds": 0.5}
    clock.workers["trials"].add(validated)
    worker = clock.workers["trials"]
    assert (worker.trace_s, worker.validate_s) == (2.5, 0.25)
    assert worker.other_s == pytest.approx(0.25)


def test_a_phase_is_timed_even_when_it_raises():
    clock = TimeBreakdown()
    with pytest.raises(RuntimeError), clock.phase("diagnostics"):
        raise RuntimeError
    assert clock.phases["diagnostics"] >= 0.0


def test_the_ceiling_names_a_precision_that_cannot_win():
    ceiling = {"device": "CPU", "size": 256, "ms": {},
               "speed": {"float32": 1.0, "bfloat16": 1.1, "float16": 0.009}}
    text = describe_ceiling(ceiling)
    assert text.startswith("bfloat16 1.1x, float16 0.009x float32's speed (a 256-wide dense "
                           "layer's training step on CPU)")
    assert "float16 cannot beat float32 on this device" in text
    ceiling["speed"]["float16"] = 0.9
    assert "cannot" not in describe_ceiling(ceiling)


def test_the_ceiling_prints_the_peak_the_models_shape_and_what_the_skip_rule_reads():
    from tuner.records.timing import peak_speed

    ceiling = {"device": "CPU", "size": 256, "ms": {},
               "speed": {"float32": 1.0, "bfloat16": 1.1, "float16": 0.009},
               "peak": {"size": 1024, "speed": {"float32": 1.0, "bfloat16": 1.9}},
               "model": {"layer": "dense", "shape": [128, 784, 256],
                         "speed": {"float32": 1.0, "bfloat16": 1.3}}}
    assert describe_ceiling(ceiling) == (
        "bfloat16 1.9x, float16 0.009x (emulated) float32's speed at the peak (a 1024-wide "
        "layer's training step, batch 1024, on CPU); at this model's largest layer (dense, "
        "batch 128, 784x256): bfloat16 1.3x; the skip rule reads a 256-wide layer's training "
        "step: bfloat16 1.1x, float16 0.009x; float16 cannot beat float32 on this device")
    assert peak_speed(ceiling, "bfloat16") == 1.9     # a pick is read against the peak
    assert peak_speed(ceiling, "float16") == 0.009    # not timed at the peak: emulated
    assert peak_speed(None, "bfloat16") is None


def test_the_largest_kernel_is_found_in_nested_and_convolutional_models():
    import keras

    from tuner.worker.device.ceiling import largest_kernel

    inner = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1000, name="wide")],
                             name="inner")
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(16, 3, name="conv")(inputs)
    h = keras.layers.Dense(64, name="narrow")(keras.layers.Flatten()(h))
    model = keras.Model(inputs, keras.layers.Dense(2)(inner(h)))
    assert largest_kernel(model, 32) == {"layer": "wide", "shape": [32, 64, 1000]}
    conv_only = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(16, 3)])
    assert largest_kernel(conv_only, 4)["shape"] == [4, 27, 16]   # 3x3x3 window -> 16 filters
    assert largest_kernel(keras.Sequential([keras.Input((4,)), keras.layers.ReLU()]), 4) is None


def test_a_policy_the_ceiling_rules_out_is_skipped_and_stays_skipped_on_resume(tmp_path):
    from dataclasses import replace

    from tuner.run.options import TuneOptions
    from tuner.run.plan import resolve

    ceiling = {"device": "CPU", "size": 256, "ms": {},
               "speed": {"float32": 1.0, "bfloat16": 1.1, "float16": 0.009}}
    options = TuneOptions(task=tmp_path / "task.py", run_dir=tmp_path / "run", space="default")
    plan, notes = resolve(options, None).within_ceiling(ceiling)
    assert plan.space.policies == ("float32", "mixed_bfloat16", "bfloat16")
    assert plan.learned.skipped_policies == ("mixed_float16", "float16")
    assert notes == ["skipping mixed_float16, float16: float16 runs a dense layer's training "
                     "step at 0.009x float32's speed on CPU, so it cannot win here (pass "
                     "--keep-slow-policies to try it anyway)"]
    assert plan.settings()["skipped_policies"] == ["mixed_float16", "float16"]
    # A resumed run keeps its decision, whatever the ceiling measures now.
    recorded = {**plan.settings(), "status": "running"}
    resumed, notes = resolve(options, recorded).within_ceiling(
        {**ceiling, "speed": {"float32": 1.0, "bfloat16": 1.1, "float16": 2.0}})
    assert resumed.space.policies == plan.space.policies and notes == []
    kept, notes = resolve(replace(options, keep_slow_policies=True), None).within_ceiling(ceiling)
    assert "mixed_float16" in kept.space.policies and notes == []


def test_figures_primed_before_a_job_are_reused_and_say_when_they_were_taken(monkeypatch,
                                                                            tmp_path):
    from tuner.worker.device import ceiling

    monkeypatch.setenv("PRECISION_TUNER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ceiling, "_measured", {})
    assert ceiling.prime() > 0.0                   # as a warm worker does at service start
    figures = ceiling.measure_ceiling()
    assert figures["reused"] is True and figures["speed"]["float32"] == 1.0
    taken = figures["measured_at"]
    assert describe_ceiling(figures).endswith(
        f" (the device's figures as this warm worker measured them before this job, "
        f"at {taken})")
    # A later process on the machine (a new worker, the next tune) reads them from its cache.
    monkeypatch.setattr(ceiling, "_measured", {})
    kept = ceiling.measure_ceiling()
    assert kept["reused"] is True and kept["ms"] == figures["ms"]
    assert kept["kept_in"] == str(tmp_path / "ceiling.json")
    assert ceiling.measure_ceiling()["kept_in"] == kept["kept_in"]   # and says so again later
    assert describe_ceiling(kept).endswith(
        f" (the device's figures as measured on this machine at {taken}, kept in "
        f"{tmp_path / 'ceiling.json'}: delete it to measure them again)")
    # Without the file, or asked for fresh figures (benchmarks/ceiling.py), it times them.
    assert "reused" not in ceiling.measure_ceiling(fresh=True)
    (tmp_path / "ceiling.json").unlink()
    monkeypatch.setattr(ceiling, "_measured", {})
    assert "reused" not in ceiling.measure_ceiling()   # a machine's first probe times them
    (tmp_path / "ceiling.json").write_text("{not json")
    monkeypatch.setattr(ceiling, "_measured", {})
    assert "reused" not in ceiling.measure_ceiling()   # an unreadable file is measured over


def test_the_probe_times_its_dtypes_in_turns_and_an_emulated_one_leaves_early(monkeypatch):
    """The machine's drift must fall on every dtype alike: the steps run float32, bfloat16,
    float16, float32, ... and a dtype whose steps took the time cap leaves the turns."""
    from tuner.worker.device import ceiling

    clock, order = [0.0], []
    cost_s = {"float32": 2.0 ** -9, "bfloat16": 2.0 ** -10, "float16": 0.5}  # float16 emulated

    def fake_step(dtype, *shape):
        def run():
            order.append(dtype)
            clock[0] += cost_s[dtype]
        return run

    monkeypatch.setattr(ceiling, "_step", fake_step)
    monkeypatch.setattr(ceiling.time, "perf_counter", lambda: clock[0])
    ms, spread = ceiling._time_steps("CPU", ceiling.DTYPES)
    assert order[:6] == ["float32", "bfloat16", "float16"] * 2
    capped = int(ceiling._MAX_TIMED_S / 0.5)
    assert order.count("float16") == capped                    # then it left the turns
    after = order[3 * capped:]
    assert after and "float16" not in after
    assert after[::2] == ["float32"] * len(after[::2])         # the others kept alternating
    assert after[1::2] == ["bfloat16"] * len(after[1::2])
    assert ms == {"float32": 1000 * 2.0 ** -9, "bfloat16": 1000 * 2.0 ** -10, "float16": 500.0}
    assert spread == {"float32": 0.0, "bfloat16": 0.0, "float16": 0.0}   # steady steps: no noise
