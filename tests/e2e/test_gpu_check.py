"""``precision-tuner gpu-check`` (what ``make gpu-check`` runs) on a machine without a GPU: it
says so and what a GPU run would check, runs its three steps to the end on the CPU, and prints
the report a GPU user pastes into an issue, from the steps' own records."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_gpu_check_runs_to_the_end_on_the_cpu_and_reports_from_the_records(tmp_path):
    folder = tmp_path / "check"
    env_path = tmp_path / "bin"          # no nvidia-smi on this PATH: the CPU's answer
    env_path.mkdir()
    done = subprocess.run([sys.executable, "-m", "tuner", "gpu-check", "--dir", str(folder),
                           "--epochs", "2"], capture_output=True, text=True, cwd=ROOT,
                          timeout=900, env={"PATH": f"{env_path}:/usr/bin:/bin",
                                            "HOME": str(tmp_path),
                                            "PRECISION_TUNER_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "no NVIDIA GPU visible" in done.stdout and "on a GPU it checks" in done.stdout
    for step in ("tune", "bench", "train"):
        assert f"gpu-check: {step} done" in done.stdout
    pasted = done.stdout.split("----- paste from here -----")[1].split("----- to here -----")[0]
    assert pasted.strip() == (folder / "report.md").read_text().strip()
    train = json.loads((folder / "train" / "train.json").read_text())
    best = json.loads((folder / "best_precision.json").read_text())
    assert "NVIDIA devices visible: none" in pasted
    assert f"pick: {best['policy']} at" in pasted
    assert f"ratio {train['verdict']['ratio']:.2f}" in pasted
    assert "float32's products: float32" in pasted and '"before_tensorflow": true' in pasted
