"""The Keras guide's GAN (examples/dcgan.py: its own compile, two optimizers, no call()) tuned
end to end through the command line, on the local executor and on Ray: each optimizer's loss
scale and each loss in the records (trials.json and MLflow), both losses judged."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support.records import read_trials

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_the_guides_gan_tunes_end_to_end(tmp_path, executor):
    run_dir, out = tmp_path / "run", tmp_path / "best.json"
    # float16 too (--keep-slow-policies): its trials are the ones with loss scales to record.
    completed = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", str(ROOT / "examples" / "dcgan.py"),
         "--space", "quick", "--steps", "16", "--executor", executor, "--keep-slow-policies",
         "--confirm-seconds", "4", "--run-dir", str(run_dir), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    trials = read_trials(run_dir)
    trained = [t for t in trials if t["result"]["losses"]]
    assert len(trained) == len(trials) >= 3
    for entry in trained:   # every loss of every step, each optimizer by name
        result = entry["result"]
        assert set(result["loss_terms"]) == {"d_loss", "g_loss"}
        assert len(result["loss_terms"]["g_loss"]) == len(result["losses"])
        assert [o["name"] for o in result["optimizers"]] == ["d_optimizer", "g_optimizer"]
        if entry["verdict"] == "unstable":   # judged on one of its losses, named
            assert entry["reason"].split()[0] in ("d_loss", "g_loss", "val_metric",
                                                  "d_optimizer:", "g_optimizer:", "skipped")
    float16 = [t for t in trained if t["config"]["policy"] == "mixed_float16"
               and t["config"]["loss_scale"]["kind"] == "dynamic"]
    assert float16, [t["config"]["policy"] for t in trained]
    for record in float16[0]["result"]["optimizers"]:
        assert record["initial_loss_scale"] == 2.0 ** 15
        # A dynamic scale read at each step: 2 ** 15 halved on each overflow, floored at 1.
        assert record["loss_scales"] and set(record["loss_scales"]) <= {2.0 ** k
                                                                      for k in range(16)}
    assert json.loads(out.read_text())["policy"] in ("float32", "mixed_bfloat16",
                                                      "mixed_float16")
    if executor == "local":   # the export applied as the example shows (the docs include it)
        applied = subprocess.run([sys.executable, str(ROOT / "examples" / "dcgan.py"), str(out),
                                  "1"], cwd=tmp_path, capture_output=True, text=True,
                                 timeout=600)
        assert applied.returncode == 0, applied.stdout[-2000:] + applied.stderr[-2000:]
        assert "trained under " in applied.stdout and "val_metric " in applied.stdout

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string=f"tags.trial_number = '{float16[0]['number']}'")
    assert len(runs) == 1, [r.data.tags for r in runs]
    metrics = runs[0].data.metrics
    for name in ("loss_scale.d_optimizer", "loss_scale.g_optimizer", "d_loss", "g_loss"):
        assert name in metrics, sorted(metrics)
        history = client.get_metric_history(runs[0].info.run_id, name)
        assert len(history) == len(float16[0]["result"]["losses"])
