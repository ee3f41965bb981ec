"""float16 end to end through the CLI, forced on any CPU (``--keep-slow-policies``), on tiny
models: what a loss scale does is visible in the verdicts, so each test fails if loss scaling
were a no-op (the dynamic trial would then learn as little as the unscaled one, or a fixed
scale's overflowing steps would be applied instead of skipped)."""

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TASKS
from tests.support.records import read_trials

pytestmark = pytest.mark.slow


def tune(tmp_path, task, space_text, *flags):
    space = tmp_path / "space.yaml"
    space.write_text(space_text)
    out = tmp_path / "best.json"
    # float16 is emulated (slow) on a CPU: the speed objective would skip or stop it. Under
    # memory nothing is skipped or stopped for speed, and the flag is left out on purpose.
    keep = [] if "memory" in flags else ["--keep-slow-policies"]
    completed = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", str(TASKS / f"{task}.py"), "--space", str(space),
         "--executor", "local", *keep, "--exhaustive", "--steps", "30",
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
    # ... and it names the layers whose gradients vanish, from the diagnostics' histograms.
    assert "weight gradients float16 flushes to zero at scale 1: dense" in kinds["none"]["reason"]
    assert kinds["dynamic"]["verdict"] == "stable", kinds["dynamic"]["reason"]
    assert best["policy"] == "mixed_float16" and best["loss_scale"]["kind"] == "dynamic"
    assert best["provenance"]["confirmation"]["verdict"] == "passed"
    why = best["provenance"]["loss_scale_why"]
    assert why.startswith("dynamic, starts at 2^15: from the space's initial_scales"), why
    assert "loss scale: dynamic, starts at 2^15: from" in stdout   # (the console wraps it)
    assert re.search(r"of the ceiling: [0-9.]+x is [0-9]+% of float16's peak [0-9.]+x", stdout)


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


def test_a_scale_that_cannot_help_collapses_and_says_so(tmp_path):
    """zero_norm.py: NaN gradients in float16 at every scale (sqrt's derivative at an exact 0)."""
    trials, best, _ = tune(tmp_path, "zero_norm", (
        "policies: [float32, mixed_float16]\n"
        "loss_scale: {kinds: [dynamic], initial_scales: [32768]}\n"
        "trial: {steps: 30, warmup_steps: 3}\n"), "--no-confirm")
    dynamic = _by_kind(trials)["dynamic"]
    assert dynamic["verdict"] == "unstable"
    assert dynamic["reason"].startswith("the loss scale collapsed: non-finite gradients at every "
                                        "scale it tried, from 32768 down to its floor (1)")
    assert all(v == v for v in dynamic["result"]["losses"])   # the NaN updates were skipped
    assert best["policy"] == "float32"


def test_a_forward_overflow_is_repaired_by_keeping_its_layer_in_float32(tmp_path):
    """soft_pool.py: a hand-written softmax's exp overflows float16 inside one layer."""
    trials, _, stdout = tune(tmp_path, "soft_pool", (
        "policies: [float32, mixed_float16]\n"
        "loss_scale: {kinds: [dynamic], initial_scales: [32768]}\n"
        "trial: {steps: 30, warmup_steps: 3}\n"), "--no-confirm")
    float16 = [t for t in trials if t["config"]["policy"] == "mixed_float16"]
    unplaced, repaired = float16
    assert unplaced["verdict"] == "unstable"
    assert "(first non-finite output: layer soft_pool)" in unplaced["reason"]
    assert repaired["config"]["float32"]["layers"] == ["soft_pool"]
    assert repaired["verdict"] == "stable", repaired["reason"]
    # Its gradients (up to 665 in float32) overflow at 2^15: the dynamic scale backed off.
    assert repaired["result"]["skipped_steps"] >= 1
    assert repaired["result"]["loss_scales"][-1] < 32768
