"""TF32, a named fact of every run (tuner.worker.device.tf32): what TensorFlow does with
float32's products on the trial device, recorded, said where it applies, and turned off in
every trial by --strict-float32. On a CPU nothing runs in TF32: the setting is still read and
set as on a GPU, and the GPU's answer is checked on its facts."""

import pytest


def test_on_a_cpu_tf32_is_tensorflows_default_setting_and_applies_to_nothing():
    from tuner.worker.device.tf32 import facts

    assert facts() == {"enabled": True, "supported": False, "applies": False}


@pytest.mark.parametrize("strict", [True, False])
def test_a_trial_sets_tf32_as_its_spec_asks_whatever_the_worker_ran_before(task_path, strict):
    import tensorflow as tf

    from tuner.apply.config import PrecisionConfig
    from tuner.trial_types import TrialSpec
    from tuner.worker.trial.trial import run_trial

    tf.config.experimental.enable_tensor_float_32_execution(strict)   # the previous job's
    try:
        spec = TrialSpec(0, task_path("tiny_mlp"), PrecisionConfig().to_dict(), 4, 1,
                         strict_float32=strict)
        run_trial(spec.to_dict())
        assert tf.config.experimental.tensor_float_32_execution_enabled() is (not strict)
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(True)


def test_the_run_says_what_float32_means_on_a_gpu_with_tf32_units():
    from tuner.run.model_fit import tf32_line

    ampere = {"enabled": True, "supported": True, "applies": True}
    assert "run in TF32 on this GPU" in tf32_line(ampere, strict=False)
    assert "--strict-float32" in tf32_line(ampere, strict=False)
    assert "IEEE float32 in every trial" in tf32_line(ampere, strict=True)
    assert tf32_line({"enabled": True, "supported": False, "applies": False}, False) == ""
    assert tf32_line({}, False) == ""


def test_run_json_and_the_export_record_the_float32_products():
    from types import SimpleNamespace

    from tuner.run.closing import float32_math
    from tuner.task_facts import TaskFacts

    ampere = TaskFacts(tf32={"enabled": True, "supported": True, "applies": True})
    cpu = TaskFacts(tf32={"enabled": True, "supported": False, "applies": False})
    loose, strict = SimpleNamespace(strict_float32=False), SimpleNamespace(strict_float32=True)
    assert float32_math(ampere, loose)["float32_products"] == "tf32"
    assert float32_math(ampere, strict) == {"enabled": True, "supported": True,
                                            "applies": True, "strict": True,
                                            "float32_products": "float32"}
    assert float32_math(cpu, loose)["float32_products"] == "float32"
