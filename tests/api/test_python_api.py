"""tuner.tune from Python: the CLI's options as keyword arguments (one definition), its errors
as exceptions, and a model defined in a fresh interpreter's ``__main__`` tuned end to end."""

import dataclasses
import inspect
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import tuner
from tests.conftest import ROOT
from tests.support.fresh_imports import loaded_after
from tuner.cli.app import build_parser
from tuner.errors import UsageError
from tuner.judging.objective import Objective
from tuner.run.option_checks import option_fields
from tuner.run.options import TuneOptions


def _cli_tune_actions():
    parser = build_parser()
    tune = next(action for action in parser._actions if action.dest == "command").choices["tune"]
    return {action.dest: action for action in tune._actions
            if action.option_strings and action.dest != "help"}


def test_every_cli_flag_is_a_typed_keyword_of_tune_with_its_default():
    signature = inspect.signature(tuner.tune)
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    cli = _cli_tune_actions()
    options = {option.name: option for option in option_fields(TuneOptions)}
    assert set(options) == set(cli)
    # tune() takes each option in the type TuneOptions holds it in; a space as a Path too, and
    # a run directory and output that default to the run directory's own.
    held = typing.get_type_hints(TuneOptions)
    widened = {"space": str | Path | None, "run_dir": Path | None, "out": Path | None}
    for name, action in cli.items():
        parameter = signature.parameters[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.annotation == widened.get(name, held[name]), name
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
    # TuneOptions, the job's one input, checks values (not their text) as it is built, and
    # holds each in its type; frozen, so the job cannot write back into it.
    options = TuneOptions(task="task.py", run_dir=str(tmp_path), objective="memory", min_gain=0,
                          space=tmp_path / "space.yaml", workers="AUTO")
    assert options.task == Path("task.py") and options.run_dir == tmp_path
    assert options.objective is Objective.MEMORY and options.workers == "auto"
    assert options.min_gain == 0.0 and isinstance(options.min_gain, float)
    assert options.space == str(tmp_path / "space.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.trials = 3
    for given, line in [({"trials": 0}, "argument --trials: must be at least 1, got 0"),
                        ({"trials": 2.5}, "argument --trials: expected a positive integer, "
                                          "got 2.5"),
                        ({"finalists": None}, "argument --finalists: expected a positive "
                                              "integer, got None"),
                        ({"seed": "7"}, "argument --seed: invalid int value: '7'")]:
        with pytest.raises(UsageError) as raised:
            TuneOptions(task="task.py", run_dir=tmp_path, **given)
        assert str(raised.value).startswith(line), raised.value


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
         "--run-dir", str(run_dir),
         # 16-bit trials too where the suite's own ceiling (measured under its load) would
         # skip them: what is tested here is the shipping by value, not the skip rule.
         "--keep-slow-policies"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "applied " in completed.stdout and "one epoch, loss" in completed.stdout
    task_dir = tmp_path / "run.task"   # a small task file, the arrays as data beside it
    assert (task_dir / "python_task.py").stat().st_size < 1500
    assert (task_dir / "python_task.pkl").stat().st_size > 2048 * 32 * 4 + 2048 * 8
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


def test_a_task_from_python_is_a_small_file_its_data_a_file_beside_it(tmp_path):
    """The arrays go into a data file as their own bytes (pickle protocol 5, no base64 text);
    the task file is a few lines that load it by a path relative to itself, and refuses in
    one line when the data beside it is missing or was changed."""
    import numpy as np

    from tuner.api import data_file
    from tuner.api.task_writer import task_objects, write_task
    from tuner.errors import TaskError
    from tuner.worker.task.task_loader import load_task

    x = np.arange(500_000, dtype="float32").reshape(1000, 500)    # 2 MB
    y = np.arange(1000, dtype="int64")
    path = write_task(tmp_path / "from_python.py", task_objects(lambda: None, (x, y), "mse"))
    data = tmp_path / "from_python.pkl"
    text = path.read_text()
    assert len(text) < 1500 and max(len(line) for line in text.splitlines()) <= 100
    assert "b64" not in text and f"{data.stat().st_size:,} bytes" in text
    raw = x.nbytes + y.nbytes
    assert raw < data.stat().st_size < raw + 5_000
    kept = data_file.load(data)["train_data"]()
    assert np.array_equal(kept[0], x) and np.array_equal(kept[1], y)
    # the arrays are the file's pages, mapped, not a copy: writable, copied only where written
    assert not kept[0].flags.owndata and kept[0].flags.writeable
    loaded = load_task(str(path)).train_data()
    assert np.array_equal(loaded[0], x) and np.array_equal(loaded[1], y)
    assert not list(tmp_path.glob(".*"))       # no partial file left behind

    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / path.name).write_text(text)        # the task without its data
    with pytest.raises(TaskError, match="from_python.pkl .* is missing or was changed"):
        load_task(str(moved / path.name))
    with pytest.raises(UsageError, match="could not be pickled"):
        write_task(tmp_path / "lock.py", task_objects(lambda: None, (x, y), _Unpicklable()))
    assert not list(tmp_path.glob("*lock*")) and not list(tmp_path.glob(".*"))


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot pickle this loss")


def test_ray_ships_a_task_once_not_with_every_trial(tmp_path, monkeypatch):
    """A task written from Python has its arrays in a data file: the driver puts its code and
    the data's bytes in Ray's object store once per job, every trial's spec carries only a
    digest and references, and a worker fetches the code the first time it sees the digest,
    the data only where its node lacks the file. A Ray instance of the driver's own (this
    machine only) ships no data: its workers read the driver's file."""
    import pickle
    import tempfile

    import numpy as np
    import ray

    from tuner.api.task_writer import task_objects, write_task
    from tuner.execution.ray_pool import RayExecutor
    from tuner.trial_types import TrialSpec
    from tuner.worker.task import task_loader

    x = np.ones((1000, 500), "float32")              # 2 MB
    path = write_task(tmp_path / "from_python.py", task_objects(lambda: None, (x, x), "mse"))
    put = []
    monkeypatch.setattr(ray, "put", lambda value: put.append(value) or f"ref-{len(put)}")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node"))
    executor = RayExecutor.__new__(RayExecutor)       # only the shipping, no cluster
    executor.task_source_cache, executor._owns_ray = {}, False
    payloads = [executor._with_source(TrialSpec(number, str(path), {}, 10, 2))
                for number in range(5)]
    data = (tmp_path / "from_python.pkl").read_bytes()
    assert put[0] == path.read_text() and put[1].tobytes() == data and len(data) > x.nbytes
    assert not put[1].flags.owndata            # the file's pages, not a copy in the driver
    assert max(len(pickle.dumps(payload)) for payload in payloads) < 2_000
    assert all(TrialSpec.from_dict(payload).task_path == str(path) for payload in payloads)

    task_loader.forget_tasks()
    fetched = []
    elsewhere = "/node-without-the-file/from_python.py"
    for payload in payloads:
        shipped = payload["shipped"]
        task_loader.receive_task(elsewhere, shipped["digest"],
                                 lambda: fetched.append("code") or put[0],
                                 (shipped["data_name"], lambda: fetched.append("data") or put[1]))
    assert fetched == ["code", "data"]
    here = Path(task_loader.task_file_here(elsewhere))
    assert here.read_text() == put[0] and here.with_suffix(".pkl").read_bytes() == data
    assert here.is_relative_to(tmp_path / "node")
    assert np.array_equal(task_loader.load_task(str(here)).train_data()[0], x)

    task_loader.forget_tasks()                        # a node with the driver's files
    task_loader.receive_task(str(path), shipped["digest"], lambda: put[0],
                             (shipped["data_name"], lambda: fetched.append("again")))
    assert task_loader.task_file_here(str(path)) == str(path) and "again" not in fetched

    put.clear()
    executor.task_source_cache, executor._owns_ray = {}, True
    assert "data_ref" not in executor._with_source(TrialSpec(0, str(path), {}, 10, 2))["shipped"]
    assert put == [path.read_text()]
    task_loader.forget_tasks()


def test_loss_none_is_a_choice_and_a_missing_loss_is_refused(tmp_path):
    """``loss=None`` (a train_step that computes its own loss, the Keras guide's VAE) is
    written into the task as ``LOSS = None``, with data that has no labels; leaving ``loss``
    out is still refused."""
    import numpy as np

    from tuner.api.task_writer import task_objects, write_task
    from tuner.worker.task.task_loader import load_task

    with pytest.raises(UsageError, match="missing: loss"):
        tuner.tune(build_model=lambda: None, train_data=([1.0], [1.0]), run_dir=tmp_path / "r")
    images = np.zeros((8, 4), "float32")
    path = write_task(tmp_path / "task.py", task_objects(lambda: None, images, None))
    task = load_task(str(path))
    assert task.loss is None
    assert np.array_equal(task.train_data(), images)


@pytest.mark.slow
def test_a_ray_worker_without_the_drivers_files_trains_on_the_shipped_data(tmp_path):
    """Ray started by the caller (as for a cluster): the data's bytes go into Ray's object
    store with the task's code. The driver's files are moved away once shipped, as on a node
    that never had them: the worker copies the task and its data from the object store and
    trains on the arrays. The task runs in the driver's working directory (Ray on this
    machine), its data found beside the task file, not there."""
    import os
    import shutil
    import tempfile

    import numpy as np
    import ray

    from tuner.api.task_writer import task_objects, write_task
    from tuner.apply.config import PrecisionConfig
    from tuner.execution.ray_pool import RayExecutor
    from tuner.trial_types import TrialOutcome, TrialSpec

    marker = tmp_path / "cwd.txt"

    def build_model():
        import keras

        marker.write_text(os.getcwd())
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),
                                 keras.layers.Dense(1)])

    x = np.random.default_rng(0).normal(size=(512, 8)).astype("float32")
    driver_dir = tmp_path / "driver"
    path = write_task(driver_dir / "from_python.py",
                      task_objects(build_model, (x, x.sum(axis=1)), "mse", batch_size=32))
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 * 1024 * 1024)
    executor = RayExecutor(workers=1)
    copy = Path("/nonexistent")
    try:
        shipped = executor._shipped(str(path))
        assert {"data_name", "data_ref"} <= set(shipped)
        shutil.move(driver_dir, tmp_path / "gone")     # the worker's node has no such path
        info = executor.probe(str(path), 4)
        assert info["batch_size"] == 32
        result = executor.run(TrialSpec(0, str(path), PrecisionConfig().to_dict(), 6, 2), 300)
        assert result.outcome is TrialOutcome.COMPLETED, result.failure_message
        assert len(result.losses) == 6 and np.isfinite(result.losses).all()
        assert marker.read_text() == os.getcwd()
        copy = Path(tempfile.gettempdir()) / "precision-tuner-tasks" / shipped["digest"]
        assert (copy / "from_python.pkl").read_bytes() == \
            (tmp_path / "gone" / "from_python.pkl").read_bytes()
    finally:
        executor.close()
        ray.shutdown()
        shutil.rmtree(copy, ignore_errors=True)


def test_objective_is_importable_from_the_package_and_is_what_tune_takes():
    """``from tuner import Objective`` (python.md's ``objective=Objective.MEMORY``) is the
    enum ``tune`` is typed with, and importing it loads no heavy package."""
    from tuner import Objective as public

    assert public is Objective and "Objective" in tuner.__all__ and "Objective" in dir(tuner)
    assert public("memory") is public.MEMORY
    annotated = inspect.signature(tuner.tune).parameters["objective"].annotation
    assert annotated == (public | None)
    assert loaded_after("from tuner import Objective") == []


def test_data_that_cannot_travel_to_a_worker_is_refused_saying_what_to_pass(tmp_path):
    """A function returning a dataset made outside it (a notebook's ``lambda: ds``) cannot be
    pickled for the workers: refused before any trial, naming what to pass instead. The
    dataset object itself (endless, here) is read once in the caller: its first batches
    travel, and the worker's task returns them."""
    import numpy as np
    import tensorflow as tf

    from tuner.api.task_writer import RECORDED_BATCHES, task_objects, write_task
    from tuner.worker.task.task_loader import load_task

    x, y = np.ones((64, 4), "float32"), np.arange(64, dtype="int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()
    with pytest.raises(UsageError) as refused:
        write_task(tmp_path / "lambda.py", task_objects(lambda: None, lambda: data, "mse"))
    message = str(refused.value)
    assert "a function that builds the dataset" in message and "\n" not in message
    path = write_task(tmp_path / "object.py", task_objects(lambda: None, data, "mse"))
    batches = list(load_task(str(path)).train_data())
    assert len(batches) == RECORDED_BATCHES                  # an endless dataset, bounded
    assert np.array_equal(batches[1][1], y[8:16])
    with pytest.raises(UsageError, match="must be what model.fit"):
        task_objects(lambda: None, 3, "mse")
