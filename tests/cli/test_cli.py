"""Bad input: exit code 2, one line saying what, the bad value and the fix; nothing written."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TASKS
from tuner.cli.app import main
from tuner.dependency_versions import declared_range


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=300)


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "syntax.py").write_text("def build_model(:\n")
    (tmp_path / "incomplete.py").write_text("def build_model():\n    pass\n")
    (tmp_path / "broken.yaml").write_text("policies: [float32\n")
    (tmp_path / "unknown.yaml").write_text("policies: [float32, float8]\n")
    (tmp_path / "exists.json").write_text("{}")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "something").write_text("x")
    (tmp_path / "task.txt").write_text("build_model = train_data = LOSS = None\n")
    # An interrupted run (as `tune` leaves run.json) and a finished one, to resume.
    for name, status in (("interrupted", "interrupted"), ("finished", "finished")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({
            "schema_version": 1, "task": str(Path(TINY).resolve()), "space": "quick",
            "trials": 4, "steps": 20, "seed": 0, "tolerance": 0.9, "exhaustive": False,
            "min_gain": 0.03, "skipped_policies": [], "objective": "speed",
            "memory_slack": 0.1, "sizing": None, "sized_by": "", "batch_pool": 20,
            "study_name": "s", "parent_run_id": "p", "status": status}))
    return tmp_path


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


TINY = str(TASKS / "tiny_mlp.py")
OTHER = str(TASKS / "subclassed.py")


@pytest.mark.parametrize("args, fragment", [
    (["tune", "{tmp}/absent.py"], "task file not found"),
    (["tune", "{tmp}/syntax.py"], "syntax error at line 1"),
    (["tune", "{tmp}/incomplete.py"], "does not define train_data, LOSS"),
    (["tune", TINY, "--space", "{tmp}/broken.yaml"], "YAML syntax error at line"),
    (["tune", TINY, "--space", "{tmp}/unknown.yaml"], "'float8'"),
    (["tune", TINY, "--space", "enormous"], "unknown search space 'enormous'"),
    (["tune", TINY, "--trials", "0"], "--trials: must be at least 1, got 0"),
    (["tune", TINY, "--tolerance", "abc"], "expected a number such as 0.9"),
    (["tune", TINY, "--exhaustive", "--trials", "3"], "cannot be combined with --trials 3"),
    (["tune", TINY, "--objective", "fastest"], "invalid choice: 'fastest'"),
    (["tune", TINY, "--memory-slack", "2"], "--memory-slack: must be in [0, 1), got 2.0"),
    (["tune", TINY, "--trial-seconds", "0"], "--trial-seconds: must be in (0, 3600] seconds"),
    (["tune", TINY, "--trial-seconds", "soon"], "expected a number of seconds such as 5"),
    (["tune", TINY, "--steps", "30", "--trial-seconds", "2"],
     "--steps fixes their count instead. Received: --steps 30 --trial-seconds 2. Drop one"),
    (["tune", TINY, "--run-dir", "{tmp}/full"], "is not empty"),
    (["tune", TINY, "--run-dir", "/proc/precision-tuner"], "not writable"),
    (["export", "--run-dir", "{tmp}/nowhere"], "run directory not found"),
    (["ui", "--run-dir", "{tmp}"], "no MLflow store"),
    # flags that contradict each other or the run being resumed
    (["tune", TINY, "--executor", "local", "--workers", "2"],
     "--workers and --ray-address need Ray. Received: --executor local --workers 2."
     " Drop them, or pass --executor auto or ray"),
    (["tune", TINY, "--executor", "local", "--ray-address", "127.0.0.1:6379"],
     "Received: --executor local --ray-address 127.0.0.1:6379. Drop them"),
    (["tune", TINY, "--resume", "--run-dir", "{tmp}/fresh"], "holds no run to resume"),
    (["tune", TINY, "--resume", "--run-dir", "{tmp}/interrupted", "--seed", "5"],
     "--seed 5 differs from the interrupted run's 0; a resumed run keeps its settings. Drop "
     "--seed"),
    (["tune", TINY, "--run-dir", "{tmp}/interrupted", "--steps", "40"],
     "--steps 40 differs from the interrupted run's 20"),
    (["tune", TINY, "--run-dir", "{tmp}/interrupted", "--space", "default"],
     "--space default differs from the interrupted run's 'quick'"),
    (["tune", TINY, "--run-dir", "{tmp}/interrupted", "--tolerance", "0.8"],
     "--tolerance 0.8 differs from the interrupted run's 0.9"),
    (["tune", TINY, "--run-dir", "{tmp}/interrupted", "--exhaustive"],
     "was started with a budget of trials; a resumed run keeps its settings"),
    (["tune", TINY, "--run-dir", "{tmp}/interrupted", "--trial-seconds", "3"],
     "a resumed run keeps how its trials were sized"),
    (["tune", OTHER, "--run-dir", "{tmp}/interrupted"], "belongs to task"),
    (["tune", TINY, "--resume", "--run-dir", "{tmp}/finished"], "already finished. Export"),
    # values out of range
    (["tune", TINY, "--steps", "6"],
     "--steps must exceed the space's warmup_steps (5) by at least 3"),
    (["tune", TINY, "--out", "{tmp}/best.txt"], "--out must end in .json, .yaml or .yml. "
     "Received: --out"),
    (["tune", TINY, "--tolerance", "1.2"], "--tolerance: must be in (0, 1]"),
    (["tune", TINY, "--tolerance", "0"], "--tolerance: must be in (0, 1]"),
    (["tune", TINY, "--tolerance", "-0.5"], "--tolerance: must be in (0, 1]"),
    (["tune", TINY, "--workers", "0"], "--workers: must be at least 1, got 0"),
    (["tune", TINY, "--finalists", "0"], "--finalists: must be at least 1, got 0"),
    (["tune", TINY, "--time-limit", "soon"], "--time-limit: expected a positive integer"),
    (["tune", TINY, "--min-gain", "1"], "--min-gain: must be in [0, 1), got 1.0"),
    (["tune", TINY, "--seed", "abc"], "--seed: invalid int value: 'abc'"),
    (["tune", TINY, "--executor", "dask"], "--executor: invalid choice: 'dask'"),
    (["tune", "{tmp}/task.txt"], "task file must be a Python file (.py)"),
    (["tune", TINY, "--ray-address", "127.0.0.1"], "--ray-address needs a host and a port"),
])
def test_bad_input_exits_2_with_one_line(bad_files, args, fragment, capsys, monkeypatch):
    # In this process: a refusal is the same code path as in `python -m tuner` (whose own exit
    # status and stderr are checked below, on a few of these), at a fraction of the time.
    monkeypatch.chdir(ROOT)
    args = [a.replace("{tmp}", str(bad_files)) for a in args]
    if "--run-dir" not in args and args[0] == "tune":
        args += ["--run-dir", str(bad_files / "run")]
    before = sorted(p.name for p in bad_files.rglob("*"))
    try:
        code = main(args)
    except SystemExit as exc:   # argparse's own refusals: the same one-line form, exit 2
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert fragment in lines[0]
    assert sorted(p.name for p in bad_files.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("args, fragment", [
    (["tune", "{tmp}/syntax.py"], "syntax error at line 1"),
    (["tune", TINY, "--objective", "fastest"], "invalid choice: 'fastest'"),
    (["tune", TINY, "--resume", "--run-dir", "{tmp}/finished"], "already finished. Export"),
])
def test_the_command_itself_exits_2_with_one_line(bad_files, args, fragment):
    args = [a.replace("{tmp}", str(bad_files)) for a in args]
    completed = cli(*args)
    assert completed.returncode == 2, completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    assert fragment in completed.stderr


@pytest.mark.parametrize("flag, value, fix", [
    ("--ray-address", "127.0.0.1:{port}", "Start the cluster (`ray start --head`)"),
    ("--ray-address", "ray://127.0.0.1:{port}", "Start the cluster (`ray start --head`)"),
    ("--tracking-uri", "http://127.0.0.1:{port}", "Start the tracking server"),
])
def test_an_unreachable_server_is_refused_within_seconds(tmp_path, flag, value, fix):
    value = value.format(port=closed_port())
    began = time.monotonic()
    completed = cli("tune", TINY, flag, value, "--run-dir", str(tmp_path / "run"),
                    "--out", str(tmp_path / "best.json"))
    elapsed = time.monotonic() - began
    assert completed.returncode == 2, completed.stderr
    (line,) = completed.stderr.strip().splitlines()
    assert f"{flag} is unreachable" in line and value in line and fix in line, line
    assert elapsed < 60, f"took {elapsed:.0f} s"
    assert list(tmp_path.iterdir()) == []  # nothing written


BAD_TASKS = TASKS / "bad"


@pytest.mark.slow
@pytest.mark.parametrize("task, fragment", [
    ("batch_size_float", "BATCH_SIZE in batch_size_float.py must be a positive integer. "
                         "Received: BATCH_SIZE=32.0 (of type float). Set it to a whole number"),
    ("returns_layers", "build_model() in returns_layers.py must return a keras.Model. Received: "
                       "[<KerasTensor"),
    ("too_few_samples", "has 10 samples, fewer than BATCH_SIZE=32. Lower BATCH_SIZE or provide "
                        "more data"),
    ("length_mismatch", "different numbers of samples (first dimensions [300, 320]). x and y "
                        "must have one row per sample"),
    ("empty_dataset", "returned an empty dataset. Provide at least one batch"),
    ("unbatched_dataset", "yields unbatched elements: x of shape (4,), while the model takes "
                          "(None, 4). Call .batch(BATCH_SIZE) on the dataset"),
    ("inf_in_data", "has 1 NaN/inf value(s) in y (the first in row 3). Clean or impute the data"),
    ("import_error", "importing task file import_error.py raised FileNotFoundError: [Errno 2] "
                     "No such file or directory: '/nonexistent/precision-tuner/features.npy'. "
                     "Fix the task file"),
])
def test_a_task_that_breaks_the_contract_is_refused_in_one_line(tmp_path, task, fragment):
    run_dir, out = tmp_path / "run", tmp_path / "best.json"
    completed = cli("tune", str(BAD_TASKS / f"{task}.py"), "--executor", "local",
                    "--run-dir", str(run_dir), "--out", str(out))
    assert completed.returncode == 2, completed.stdout[-2000:] + completed.stderr[-2000:]
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith("precision-tuner: error: ") and fragment in line, line
    assert list(tmp_path.iterdir()) == []  # no run directory, no --out file


@pytest.mark.slow
def test_task_with_wrong_data_structure_is_refused_before_anything_is_written(tmp_path):
    completed = cli("tune", str(TASKS / "bad_data.py"), "--run-dir", str(tmp_path / "run"),
                    "--out", str(tmp_path / "best.json"))
    assert completed.returncode == 2
    assert "must return what model.fit(x=...) takes" in \
        completed.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists() and not (tmp_path / "best.json").exists()


def test_help_lists_commands_and_is_fast():
    completed = cli("--help")
    assert completed.returncode == 0
    for command in ("tune", "export", "ui", "spaces"):
        assert command in completed.stdout

    # Neither --help nor a command that needs no model imports TensorFlow or Keras: asked of
    # the child's own sys.modules (TensorFlow's import prints nothing that says so).
    probe = ("import contextlib, io, sys\nfrom tuner.cli import main\n"
             "for argv in (['--help'], ['spaces']):\n"
             "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):"
             "\n        main(argv)\n"
             "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n")
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                               cwd=ROOT, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_float32_pattern_that_matches_no_layer_is_refused_with_the_closest_names(tmp_path):
    space = tmp_path / "typo.yaml"
    space.write_text("policies: [float32, mixed_bfloat16]\nfloat32: {layers: [dense_9*]}\n")
    completed = cli("tune", TINY, "--space", str(space), "--executor", "local",
                    "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "best.json"))
    assert completed.returncode == 2, completed.stderr
    last = completed.stderr.strip().splitlines()[-1]
    assert "'dense_9*'" in last and "dense" in last.split("'dense_9*'", 1)[1]
    assert not (tmp_path / "run").exists() and not (tmp_path / "best.json").exists()


@pytest.mark.parametrize("command", [["tune", "--executor", "local"], ["diagnose"],
                                     ["train", "--config", "cfg.json"]])
def test_an_environment_without_tensorflow_is_told_which_extra_to_install(tmp_path, command):
    """TensorFlow comes from the [cpu] or [gpu] extra: without it, one line naming the
    command that installs it into this interpreter (the CPU build, and the GPU one), exit 2,
    before a worker starts (here TensorFlow is hidden from the import system)."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import importlib.util\n_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a, **k: None if name == 'tensorflow' "
        "else _find(name, *a, **k)\n")
    env = {**os.environ, "PYTHONPATH": f"{hide}:{ROOT}"}
    verb, *flags = command
    done = subprocess.run([sys.executable, "-m", "tuner", verb, str(TASKS / "tiny_mlp.py"),
                           *flags, *(["--run-dir", str(tmp_path / "run")] if verb != "diagnose"
                                     else [])],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "TensorFlow is not installed" in lines[0], done.stderr
    declared = declared_range("tensorflow-cpu", source_tree=">=2.16.1,<3")
    assert f'{sys.executable} -m pip install "tensorflow-cpu{declared}"' in lines[0]
    assert f'"tensorflow[and-cuda]{declared}"' in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("machine, system", [("x86_64", "linux"), ("AMD64", "win32"),
                                             ("arm64", "darwin"), ("x86_64", "darwin"),
                                             ("aarch64", "linux")])
def test_the_named_tensorflow_is_what_the_cpu_extra_installs_there(machine, system):
    """The one line above names the build pyproject.toml's cpu extra chooses on each platform
    (tensorflow-cpu has no wheels for ARM or macOS), read from its environment markers."""
    from packaging.requirements import Requirement

    from tests.support.pyproject import tomllib
    from tuner.run.task_file import tensorflow_requirement

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["cpu"]
    platform = {"platform_machine": machine, "sys_platform": system}
    (chosen,) = [r for r in map(Requirement, extra) if r.marker.evaluate(platform)]
    assert f"{chosen.name}{chosen.specifier}" == \
        str(Requirement(tensorflow_requirement(machine, system))).replace(" ", "")


def test_a_second_export_in_the_same_place_keeps_the_earlier_beside_it(tmp_path):
    """`tune` run again in the same folder: the export already there is renamed after the
    time it was written, twice in the same second included; nothing is overwritten."""
    from tuner.api.job import set_aside

    out = tmp_path / "best_precision.json"
    assert set_aside(out) is None   # nothing there yet
    kept = []
    for text in ("first", "second"):
        out.write_text(text)
        os.utime(out, (1796500000, 1796500000))   # the same second both times
        kept.append(set_aside(out))
    assert not out.exists()
    assert [path.read_text() for path in kept] == ["first", "second"]
    assert kept[0].name.startswith("best_precision.") and kept[0].suffix == ".json"
    assert kept[1].name == kept[0].stem + "-2.json"
