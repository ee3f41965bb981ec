import pickle

import pytest

from tuner.apply.config import Float32Placement, LossScale, PrecisionConfig
from tuner.errors import TaskError
from tuner.records.mlflow_stores import redact_uri
from tuner.records.mlflow_text import config_params
from tuner.run.task_file import check_task_file
from tuner.trial_types import FailureClass, TrialOutcome, TrialResult, TrialSpec


def test_spec_and_result_cross_process_boundaries_as_plain_data():
    spec = TrialSpec(3, "task.py", PrecisionConfig("mixed_bfloat16").to_dict(), 20, 5,
                     stop_if_slower_than_ms=12.5)
    assert TrialSpec.from_dict(pickle.loads(pickle.dumps(spec.to_dict()))) == spec
    result = TrialResult(3, TrialOutcome.DIVERGED, losses=[1.0, float("inf")],
                         step_times_ms=[5.0, 4.0], loss_scales=[None, None],
                         failure_class=FailureClass.OTHER)
    data = result.to_dict()
    assert data["outcome"] == "diverged" and data["failure_class"] == "other"
    assert TrialResult.from_dict(pickle.loads(pickle.dumps(data))) == result


def test_median_excludes_warmup():
    result = TrialResult(0, TrialOutcome.COMPLETED, step_times_ms=[900, 50, 10, 12, 11, 13],
                         warmup_steps=2)
    assert result.timed_steps_ms == [10, 12, 11, 13]
    assert result.median_step_ms == 11.5


def test_credentials_never_leave_a_tracking_uri():
    assert redact_uri("https://alice:s3cret@mlflow.example:5000/x") == \
        "https://***@mlflow.example:5000/x"
    assert redact_uri("sqlite:///tmp/mlflow.db") == "sqlite:///tmp/mlflow.db"


def test_every_config_field_becomes_a_param():
    params = config_params(PrecisionConfig("mixed_float16", LossScale("dynamic"),
                                           float32=Float32Placement(("softmax",), ("d*",))))
    assert params["policy"] == "mixed_float16"
    assert params["loss_scale.kind"] == "dynamic"
    assert params["float32.groups"] == "softmax" and params["float32.layers"] == "d*"
    assert params["epsilon.backend"] == "-"


@pytest.mark.parametrize("text, fragment", [
    ("def build_model(:\n", "syntax error at line 1"),
    ("def build_model():\n    pass\nLOSS = 'mse'\n", "does not define train_data"),
])
def test_task_file_static_checks(tmp_path, text, fragment):
    path = tmp_path / "task.py"
    path.write_text(text)
    with pytest.raises(TaskError, match=fragment):
        check_task_file(path)


def test_a_task_that_compiles_its_model_needs_no_loss(tmp_path):
    path = tmp_path / "gan.py"
    path.write_text("def build_model():\n    pass\ndef train_data():\n    pass\n")
    with pytest.raises(TaskError, match="does not define LOSS.*or compile_model.*or "
                                        r"train_step\(model, optimizer, batch\)"):
        check_task_file(path)
    plain = path.read_text()
    path.write_text(plain + "def compile_model(model, wrap_optimizer):\n    pass\n")
    assert check_task_file(path) == path.resolve()
    path.write_text(plain + "def train_step(model, optimizer, batch):\n    pass\n")
    assert check_task_file(path) == path.resolve()   # a custom loop's step: no LOSS either
    assert check_task_file("examples/dcgan.py").name == "dcgan.py"


def test_task_file_must_exist(tmp_path):
    with pytest.raises(TaskError, match="task file not found"):
        check_task_file(tmp_path / "absent.py")
    assert check_task_file("examples/digits_mlp.py").name == "digits_mlp.py"


@pytest.mark.fast  # imports Ray, whose import may start a subprocess (Ray 2.40's GPU probe)
def test_a_worker_error_reads_as_its_own_type_and_first_line():
    import ray

    from tuner.errors import error_line

    assert error_line(ValueError("No loss to compute.\nmore")) == "ValueError: No loss to compute."
    wrapped = ray.exceptions.RayTaskError(
        "probe", "Traceback (most recent call last): ...", ValueError("No loss to compute."),
        actor_repr="<tuner.execution.ray_actor.TrialActor object>")
    assert "No loss" not in str(wrapped).splitlines()[0]    # what the check used to print
    assert error_line(wrapped) == "ValueError: No loss to compute."
