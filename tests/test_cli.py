"""Bad input: exit code 2, one line saying what, the bad value and the fix; nothing written."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT, TASKS


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
    return tmp_path


TINY = str(TASKS / "tiny_mlp.py")


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
    (["tune", TINY, "--out", "{tmp}/exists.json"], "already exists. Pass --force"),
    (["tune", TINY, "--run-dir", "{tmp}/full"], "is not empty"),
    (["tune", TINY, "--run-dir", "/proc/precision-tuner"], "not writable"),
    (["export", "--run-dir", "{tmp}/nowhere"], "run directory not found"),
    (["ui", "--run-dir", "{tmp}"], "no MLflow store"),
])
def test_bad_input_exits_2_with_one_line(bad_files, args, fragment):
    args = [a.replace("{tmp}", str(bad_files)) for a in args]
    before = sorted(p.name for p in bad_files.rglob("*"))
    completed = cli(*args, "--run-dir", str(bad_files / "run")) if "--run-dir" not in args \
        and args[0] == "tune" else cli(*args)
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert fragment in lines[0]
    assert sorted(p.name for p in bad_files.rglob("*")) == before  # nothing written


@pytest.mark.slow
def test_task_with_wrong_data_structure_is_refused_before_anything_is_written(tmp_path):
    completed = cli("tune", str(TASKS / "bad_data.py"), "--run-dir", str(tmp_path / "run"),
                    "--out", str(tmp_path / "best.json"))
    assert completed.returncode == 2
    assert "must return a batched tf.data.Dataset" in completed.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists() and not (tmp_path / "best.json").exists()


def test_help_lists_commands_and_is_fast():
    completed = cli("--help")
    assert completed.returncode == 0
    for command in ("tune", "export", "ui", "spaces"):
        assert command in completed.stdout
    assert "tensorflow" not in cli("spaces").stderr.lower()


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
