"""float16 end to end through the CLI, forced on any CPU (``--keep-slow-policies``), on tiny
models: what a loss scale does is visible in the verdicts, so each test fails if loss scaling
were a no-op (the dynamic trial would then learn as little as the unscaled one, or a fixed
scale's overflowing steps would be applied instead of skipped)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TASKS
from tests.records import read_trials

pytestmark = pytest.mark.slow


def tune(tmp_path, task, space_text, *flags):
    space = tmp_path / "space.yaml"
    space.write_text(space_text)
    out = tmp_path / "best.json"
    completed = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", str(TASKS / f"{task}.py"), "--space", str(space),
         "--executor", "local", "--keep-slow-policies", "--exhaustive", "--steps", "30",
         "--run-dir", str(tmp_path / "run"), "--out", str(out), *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return read_trials(tmp_path / "run"), json.loads(out.read_text()), completed.stdout


def _by_kind(trials):
    return {t["config"]["loss_scale"]["kind"]: t for t in trials
            if t["config"]["policy"] == "mixed_float16"}


def test_gradients_that_underflow_need_a_loss_scale_and_the_export_keeps_one(tmp_path):
    """underflow.py: the loss is scaled by 2^-30, so float16 flushes its gradients."""
    trials, best, stdout = tune(tmp_path, "underflow", (
        "policies: [float32, mixed_float16]\nloss_scale: {kinds: [none, dynamic]}\n"
        "trial: {steps: 30, warmup_steps: 3}\n"),
        "--objective", "memory", "--confirm-steps", "30")  # a float16 pick on any machine
    kinds = _by_kind(trials)
    assert kinds["none"]["verdict"] == "unstable"
    assert "of float32's loss decrease" in kinds["none"]["reason"]
    assert kinds["dynamic"]["verdict"] == "stable", kinds["dynamic"]["reason"]
    assert best["policy"] == "mixed_float16" and best["loss_scale"]["kind"] == "dynamic"
    assert best["provenance"]["confirmation"]["verdict"] == "passed"


def test_a_large_fixed_scale_skips_steps_where_a_dynamic_one_backs_off(tmp_path):
    trials, _, _ = tune(tmp_path, "padded_norm", (
        "policies: [float32, mixed_float16]\n"
        "loss_scale: {kinds: [fixed, dynamic], fixed_values: [32768], initial_scales: [32768]}\n"
        "trial: {steps: 30, warmup_steps: 3}\n"), "--no-confirm")
    kinds = _by_kind(trials)
    assert kinds["fixed"]["verdict"] == "unstable"
    assert kinds["fixed"]["reason"].startswith("skipped ")
    assert "(non-finite gradients at scale 32768)" in kinds["fixed"]["reason"]
    assert kinds["dynamic"]["verdict"] == "stable", kinds["dynamic"]["reason"]
    assert kinds["dynamic"]["result"]["skipped_steps"] >= 1   # it did back off
