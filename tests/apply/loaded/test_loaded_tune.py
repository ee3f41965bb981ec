"""The issue's case end to end: a task whose build_model() loads a float32-saved MLP tunes as
itself, through the CLI: every completed 16-bit trial computed in its 16-bit dtype (its memory
record's activations, its recorded reach), and the trials table shows the share."""

import subprocess
import sys

import pytest

from tests.apply.loaded.saved_kinds import save_all, task_file
from tests.support.records import read_trials

pytestmark = pytest.mark.slow
ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]


def test_a_loaded_model_tunes_in_its_16_bit_dtypes(tmp_path):
    save_all(tmp_path)
    task = task_file(tmp_path, "sequential_keras")
    run_dir = tmp_path / "run"
    completed = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", str(task), "--space", "quick", "--trials", "5",
         "--steps", "14", "--run-dir", str(run_dir), "--out", str(tmp_path / "best.json"),
         "--keep-slow-policies", "--no-confirm"],
        capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "16-bit params/acts" in completed.stdout
    trials = read_trials(run_dir)
    sixteen = [t for t in trials if t["config"]["policy"] != "float32"
               and t["result"]["outcome"] == "completed"]
    assert sixteen, [(t["config"]["policy"], t["verdict"], t["reason"]) for t in trials]
    for trial in sixteen:
        dtype = trial["result"]["precision_reach"]["dtype"]
        activations = trial["result"]["training_memory"]["activations"]
        assert activations.get(dtype, 0) > 0.5 * sum(activations.values()), trial["config"]
        assert trial["result"]["precision_reach"]["parameter_share"] > 0.5
    assert not [t for t in trials if t["result"]["failure_class"] == "precision_unreached"]
