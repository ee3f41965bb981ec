"""The declared dependency range: its floors as ``make test-lowest`` pins them
(.ci/lowest_requirements.py), and the one line a package outside it gets
(tuner.dependency_versions), read from the installed distribution's metadata."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from tests.support.fresh_imports import loaded_after
from tests.support.modules import load_file
from tuner import dependency_versions
from tuner.cli.app import main

ROOT = Path(__file__).resolve().parents[2]


def _lowest_requirements():
    return load_file(ROOT / ".ci" / "lowest_requirements.py")


def test_floors_are_pinned_from_pyproject_with_markers_kept():
    lowest = _lowest_requirements()
    assert lowest.pinned_at_floor("keras>=3.5.0,<4") == "keras==3.5.0"
    assert lowest.pinned_at_floor("mlflow[auth]>=3.9.0,<4") == "mlflow==3.9.0"
    assert lowest.pinned_at_floor("tensorflow-cpu>=2.16.1,<3; sys_platform != 'darwin'") \
        == 'tensorflow-cpu==2.16.1; sys_platform != "darwin"'
    assert lowest.pinned_at_floor("scikit-learn") == ""
    pins = lowest.lowest_requirements(["cpu"])
    names = {line.split("==")[0] for line in pins}
    assert {"keras", "tensorflow-cpu", "optuna", "mlflow", "ray"} <= names
    assert all("==" in line for line in pins)


def test_every_checked_package_declares_a_floor_and_a_ceiling():
    from tests.support.pyproject import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["cpu"]
    lowest = _lowest_requirements()
    for names in dependency_versions.CHECKED.values():
        for name in names:
            found = [text for text in declared
                     if lowest.Requirement(text).name == name]
            assert found, f"{name} is not declared"
            operators = {spec.operator for spec in lowest.Requirement(found[0]).specifier}
            assert {">=", "<"} <= operators, found[0]


@pytest.fixture
def keras_at(monkeypatch):
    """Pretend the installed Keras is at a given version, with the declared range fixed."""
    ranges = {"keras": ">=3.5.0,<4", "tensorflow-cpu": ">=2.16.1,<3"}
    monkeypatch.setattr(dependency_versions, "_declared_ranges", lambda: ranges)

    def at(version):
        real = metadata.version
        monkeypatch.setattr(dependency_versions.metadata, "version",
                            lambda name: version if name == "keras" else real(name))
        dependency_versions.unsupported_versions.cache_clear()

    yield at
    dependency_versions.unsupported_versions.cache_clear()


@pytest.mark.parametrize("version", ["3.4.1", "4.0.0"])
def test_a_keras_outside_the_range_gets_one_line_naming_the_fix(keras_at, version):
    keras_at(version)
    lines = dependency_versions.unsupported_versions()
    assert lines == (f"keras {version} is outside precision-tuner's supported range "
                     '>=3.5.0,<4; fix: pip install "keras>=3.5.0,<4"',)
    with pytest.warns(dependency_versions.UnsupportedVersionWarning, match="keras"):
        dependency_versions.warn_if_unsupported()


def test_a_keras_inside_the_range_gets_nothing(keras_at):
    keras_at("3.5.0")
    assert dependency_versions.unsupported_versions() == ()


def test_tune_refuses_an_unsupported_keras_in_one_line_before_it_starts(keras_at, capsys,
                                                                        tmp_path):
    keras_at("3.4.1")
    code = main(["tune", str(ROOT / "examples" / "digits_mlp.py"), "--run-dir",
                 str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.splitlines() == ["precision-tuner: error: keras 3.4.1 is outside precision-tuner's "
                                'supported range >=3.5.0,<4; fix: pip install "keras>=3.5.0,<4"']
    assert not (tmp_path / "run").exists()


def test_the_installed_environment_is_inside_the_range():
    # What `make test` and `make test-lowest` install must satisfy what the project declares.
    dependency_versions.unsupported_versions.cache_clear()
    assert dependency_versions.unsupported_versions() == ()


@pytest.mark.cli  # imports in a fresh interpreter
def test_the_check_imports_nothing_heavy():
    statement = "import tuner.dependency_versions as d; d.unsupported_versions()"
    assert loaded_after(statement) == []


@pytest.mark.parametrize("argv", [
    ["train", "TASK", "--config", "CONFIG", "--run-dir", "RUN"],
    ["bench", "TASK", "--config", "CONFIG"],
    ["diagnose", "TASK"],
    ["ui", "--run-dir", "RUN", "--no-browser"],
    ["service", "status", "--dir", "RUN"],
], ids=lambda argv: argv[0])
def test_every_command_that_trains_or_serves_refuses_an_unsupported_keras(keras_at, capsys,
                                                                          tmp_path, argv):
    """Not tune alone: each command that imports Keras, TensorFlow, Ray or MLflow refuses
    first, in the same one line, and starts nothing.
    Mutation caught: "train" dropped from tuner/cli/app.py's _TRAINING_COMMANDS."""
    keras_at("3.4.1")
    config = tmp_path / "best.json"
    config.write_text('{"schema_version": 1, "policy": "mixed_bfloat16"}')
    places = {"TASK": str(ROOT / "examples" / "digits_mlp.py"), "CONFIG": str(config),
              "RUN": str(tmp_path / "run")}
    code = main([places.get(word, word) for word in argv])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "precision-tuner: error: keras 3.4.1 is outside precision-tuner's supported range "
        '>=3.5.0,<4; fix: pip install "keras>=3.5.0,<4"']
    assert not (tmp_path / "run").exists()


def test_the_installed_metadata_puts_a_keras_below_the_floor_outside(monkeypatch):
    """The range read as it is read in use, from the installed distribution's metadata (no
    range monkeypatched): a Keras below pyproject.toml's floor is outside it.
    Mutation caught: ``if bounds:`` inverted in tuner/dependency_versions.py (every declared
    range read as empty, so nothing is ever outside)."""
    from tests.support.pyproject import tomllib

    declared = next(text for text in tomllib.loads((ROOT / "pyproject.toml").read_text())
                    ["project"]["dependencies"] if text.replace(" ", "").startswith("keras>="))
    floor = declared.split(">=")[1].split(",")[0].strip()
    real = metadata.version
    monkeypatch.setattr(dependency_versions.metadata, "version",
                        lambda name: "3.4.1" if name == "keras" else real(name))
    dependency_versions.unsupported_versions.cache_clear()
    try:
        lines = [line for line in dependency_versions.unsupported_versions()
                 if line.startswith("keras ")]
    finally:
        dependency_versions.unsupported_versions.cache_clear()
    assert len(lines) == 1 and f">={floor}" in lines[0], lines
