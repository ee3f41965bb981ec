"""A GAN trained by a custom loop (examples/gan_loop.py: a train_step function, two optimizers
by name) tuned end to end through the command line on Ray's workers, then trained in its own
loop, guarded, under the config the tune exported, as its docstring tells a user to."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support.records import read_trials
from tuner.apply.config import PrecisionConfig

pytestmark = pytest.mark.slow


def test_the_gan_loop_example_tunes_and_then_trains_guarded_under_its_pick(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "best.json"
    example = ROOT / "examples" / "gan_loop.py"
    completed = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", str(example), "--space", "quick",
         "--steps", "16", "--executor", "ray", "--keep-slow-policies",
         "--confirm-seconds", "4", "--run-dir", str(run_dir), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    trials = read_trials(run_dir)
    assert len(trials) >= 3 and all(t["result"]["losses"] for t in trials)
    for entry in trials:   # the step's two losses and both optimizers, by the dict's names
        result = entry["result"]
        assert set(result["loss_terms"]) == {"d_loss", "g_loss"}
        assert [o["name"] for o in result["optimizers"]] == ["generator_optimizer",
                                                             "discriminator_optimizer"]
    assert any(t["config"]["policy"] == "mixed_float16" for t in trials)
    PrecisionConfig.load(out)

    trained = subprocess.run([sys.executable, str(example), str(out), "2"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "epoch 2: d_loss" in trained.stdout and "guard events" in trained.stdout
