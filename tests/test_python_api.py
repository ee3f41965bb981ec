"""tuner.tune from Python: the CLI's options as keyword arguments (one definition), its errors
as exceptions, and a model defined in a fresh interpreter's ``__main__`` tuned end to end."""

import inspect
import subprocess
import typing
from pathlib import Path
import sys

import pytest

import tuner
from tests.conftest import ROOT
from tuner.cli.app import build_parser
from tuner.api.options import tune_options
from tuner.errors import UsageError
from tuner.judging.objective import Objective


def _cli_tune_actions():
    parser = build_parser()
    tune = next(action for action in parser._actions if action.dest == "command").choices["tune"]
    return {action.dest: action for action in tune._actions
            if action.option_strings and action.dest != "help"}


def test_every_cli_flag_is_a_typed_keyword_of_tune_with_its_default():
    signature = inspect.signature(tuner.tune)
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    cli = _cli_tune_actions()
    options = {option.name: option for option in tune_options(tuner.tune)}
    assert set(options) == set(cli)
    for name, action in cli.items():
        parameter = signature.parameters[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.annotation is not inspect.Parameter.empty
        assert action.option_strings == ["--" + name.replace("_", "-")]
        if name != "out":   # the CLI writes ./best_precision.json, Python the run directory's
            assert action.default == parameter.default, name
    assert signature.parameters["finalists"].default == 3
    assert signature.parameters["min_gain"].default == 0.03
    assert options["objective"].choices == tuple(Objective)
    assert "min_gain (--min-gain)" in tuner.tune.__doc__   # help(tuner.tune) lists them


@pytest.mark.parametrize("options, flags", [
    ({"trials": 0}, ["--trials", "0"]),
    ({"objective": "fastest"}, ["--objective", "fastest"]),
    ({"min_gain": -1}, ["--min-gain", "-1"]),
    ({"executor": "slurm"}, ["--executor", "slurm"]),
])
def test_a_bad_argument_raises_the_line_the_cli_prints(tmp_path, options, flags):
    with pytest.raises(UsageError) as raised:
        tuner.tune("task.py", **options)
    cli = subprocess.run([sys.executable, "-m", "tuner", "tune", "task.py", *flags], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2
    message = str(raised.value).split(". See ")[0]
    assert message and message in cli.stderr, (message, cli.stderr)


def test_unknown_and_conflicting_arguments_are_refused_in_one_line(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'trails'"):
        tuner.tune("task.py", trails=3)
    with pytest.raises(UsageError, match="--no-confirm: must be True or False"):
        tuner.tune("task.py", no_confirm="yes")
    with pytest.raises(UsageError, match="not both"):
        tuner.tune("task.py", build_model=lambda: None)
    with pytest.raises(UsageError, match="missing: train_data, loss"):
        tuner.tune(build_model=lambda: None, run_dir=tmp_path / "run")
    with pytest.raises(UsageError, match="optimizer must be a function"):
        tuner.tune(build_model=lambda: None, train_data=([1.0], [1.0]), loss="mse",
                   optimizer=object(), run_dir=tmp_path / "run")


def test_a_run_directory_without_a_run_is_refused(tmp_path):
    with pytest.raises(UsageError, match="holds no precision-tuner run"):
        tuner.load_result(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_model_defined_in_main_tunes_and_its_pick_applies(tmp_path, executor):
    """examples/from_python.py in a fresh interpreter: build_model and the arrays live in its
    __main__ (not importable by a worker), shipped by value."""
    run_dir = tmp_path / "run"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "from_python.py"), "--executor", executor,
         "--run-dir", str(run_dir)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "applied " in completed.stdout and "one epoch, loss" in completed.stdout
    result = tuner.load_result(run_dir)
    frame = result.trials
    finished = (run_dir / "trials.jsonl").read_text().splitlines()
    assert len(frame) == len(finished) >= 3          # one row per trial that ran
    assert frame["trial"].tolist() == list(range(len(frame)))
    assert frame.loc[0, "policy"] == "float32" and frame.loc[0, "verdict"] == "stable"
    assert result.best is not None and result.speedup is not None
    assert result.speedup.low <= result.speedup.value <= result.speedup.high
    assert result.decision
    assert "<table" in result._repr_html_()
    saved = result.save(tmp_path / "best.yaml")
    # The whole file, provenance too (== compares the settings only).
    assert tuner.PrecisionConfig.load(saved).to_dict() == result.best.to_dict()


def test_ray_ships_a_task_once_not_with_every_trial(tmp_path, monkeypatch):
    """A task written from Python embeds the user's arrays: the driver puts its code in Ray's
    object store once, every trial's spec carries only a digest and a reference, and a worker
    fetches the code the first time it sees the digest."""
    import pickle

    import numpy as np
    import ray

    from tuner.api.task_writer import task_objects, write_task
    from tuner.execution.ray_pool import RayExecutor
    from tuner.trial_types import TrialSpec
    from tuner.worker import task_loader

    x = np.zeros((1000, 500), "float32")              # 2 MB, more as base64
    path = write_task(tmp_path / "from_python.py", task_objects(lambda: None, (x, x), "mse"))
    put = []
    monkeypatch.setattr(ray, "put", lambda value: put.append(value) or f"ref-{len(put)}")
    executor = RayExecutor.__new__(RayExecutor)       # only the shipping, no cluster
    executor.task_source_cache = {}
    payloads = [executor._with_source(TrialSpec(number, str(path), {}, 10, 2))
                for number in range(5)]
    assert len(put) == 1 and put[0] == path.read_text() and len(put[0]) > 2_000_000
    assert max(len(pickle.dumps(payload)) for payload in payloads) < 2_000
    assert all(TrialSpec.from_dict(payload).task_path == str(path) for payload in payloads)

    fetched = []
    elsewhere = "/node-without-the-file/from_python.py"
    for payload in payloads:
        task_loader.receive_task(elsewhere, payload["shipped"]["digest"],
                                 lambda: fetched.append(1) or put[0])
    assert len(fetched) == 1
    assert Path(task_loader.task_file_here(elsewhere)).read_text() == put[0]


def test_loss_none_is_a_choice_and_a_missing_loss_is_refused(tmp_path):
    """``loss=None`` (a train_step that computes its own loss, the Keras guide's VAE) is
    written into the task as ``LOSS = None``, with data that has no labels; leaving ``loss``
    out is still refused."""
    import numpy as np

    from tuner.api.task_writer import task_objects, write_task
    from tuner.worker.task_loader import load_task

    with pytest.raises(UsageError, match="missing: loss"):
        tuner.tune(build_model=lambda: None, train_data=([1.0], [1.0]), run_dir=tmp_path / "r")
    images = np.zeros((8, 4), "float32")
    path = write_task(tmp_path / "task.py", task_objects(lambda: None, images, None))
    task = load_task(str(path))
    assert task.loss is None
    assert np.array_equal(task.train_data(), images)


def test_objective_is_importable_from_the_package_and_is_what_tune_takes():
    """``from tuner import Objective`` (python.md's ``objective=Objective.MEMORY``) is the
    enum ``tune`` is typed with, and importing it loads no heavy package."""
    from tuner import Objective as public

    assert public is Objective and "Objective" in tuner.__all__ and "Objective" in dir(tuner)
    assert public("memory") is public.MEMORY
    annotated = inspect.signature(tuner.tune).parameters["objective"].annotation
    assert typing.get_args(annotated)[0] == (public | None)   # Annotated[Objective | None, ...]
    code = ("import sys\nfrom tuner import Objective\n"
            "print(sorted(m for m in ('tensorflow', 'keras', 'mlflow', 'ray', 'optuna') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
