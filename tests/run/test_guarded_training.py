"""``precision-tuner train``'s whole guarded training (tuner.run.guarded_training): what it
refuses before anything is written or started. The trainings themselves run in
tests/apply/guard/test_train_command.py."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError, UsageError
from tuner.run.guarded_training import train


def test_a_missing_config_is_refused_before_the_run_directory_is_made(tmp_path):
    """Mutation caught: the run directory made before the config is read
    (tuner/run/guarded_training.py ``train``), leaving an empty run behind a refusal."""
    run_dir = tmp_path / "runs" / "train"
    with pytest.raises(ConfigError, match="config file not found"):
        train(tmp_path / "task.py", tmp_path / "none.json", 3, "float32", run_dir)
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_epochs_below_one_are_refused_before_the_run_directory_is_made(tmp_path):
    config = tmp_path / "bf16.json"
    config.write_text('{"policy": "mixed_bfloat16"}')
    with pytest.raises(UsageError, match="--epochs must be at least 1. Received: --epochs 0"):
        train(tmp_path / "task.py", config, 0, "float32", tmp_path / "run")
    assert not (tmp_path / "run").exists()
