"""Through the CLI, on a machine whose ceiling says 16-bit cannot win (this machine has fast
bfloat16: its per-machine cache is written with an AVX2-only CPU's figures, as that machine's
own probe would have written them), and on one whose ceiling says bfloat16 is fast."""

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, TASKS

# tiny_mlp's largest layer: Dense(32) on 16 inputs, at its batch size of 32.
SHAPE = "32x16x32"
KEY_PROGRAM = ("from tuner.worker.process.trial_worker import TrialWorker\n"
               "from tuner.worker.device.ceiling_cache import machine_key\n"
               "TrialWorker(threads=None, use_gpu=True)\n"   # as the local worker starts
               "print(machine_key('CPU'))\n")


@pytest.fixture(scope="module")
def machine_key():
    completed = subprocess.run([sys.executable, "-c", KEY_PROGRAM], capture_output=True,
                               text=True, cwd=ROOT, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout.strip().splitlines()[-1]


def _tune(tmp_path, key, bfloat16: float, float16: float, *extra):
    cache = tmp_path / "cache"
    cache.mkdir()
    model = {"float32": 1.0, "bfloat16": bfloat16, "float16": float16}
    figures = {"device": "CPU", "size": 256, "ms": {"float32": 1.0, "bfloat16": 1.0,
                                                     "float16": 1.0},
               "speed": {"float32": 1.0, "bfloat16": 0.8, "float16": 0.7},
               "measured_at": "2026-12-06 12:00:00",
               "peak": {"size": 1024, "speed": {"float32": 1.0, "bfloat16": max(bfloat16, 0.83),
                                                "float16": 0.94}},
               "models": {SHAPE: {"speed": model, "spread": dict.fromkeys(model, 0.02)}}}
    (cache / "ceiling.json").write_text(json.dumps({key: {"taken": time.time(),
                                                          "figures": figures}}))
    run_dir = tmp_path / "run"
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", str(TASKS / "tiny_mlp.py"), "--space", "quick",
         "--run-dir", str(run_dir), "--out", str(tmp_path / "best.json"), *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**__import__("os").environ, "PRECISION_TUNER_CACHE_DIR": str(cache)})
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    trials = json.loads((run_dir / "trials.json").read_text())
    return completed.stdout, trials, run_dir, time.perf_counter() - started


def test_no_fast_16bit_answers_float32_after_the_baseline(tmp_path, machine_key):
    out, trials, run_dir, _ = _tune(tmp_path, machine_key, 0.90, 0.88)
    assert [t["config"]["policy"] for t in trials] == ["float32"]
    text = " ".join(out.split())   # the console wraps long lines
    assert ("best: float32 (trial #0): this CPU has no fast bfloat16 or float16: bfloat16 0.9x "
            "at your largest layer") in text
    assert "what 16-bit would still buy: memory, not speed" in text
    assert "pass --keep-slow-policies to train the 16-bit policies anyway" in text
    timing = json.loads((run_dir / "timing.json").read_text())
    assert timing["workers"]["re-measurement"]["runs"] == 0
    assert json.loads((tmp_path / "best.json").read_text())["policy"] == "float32"


def test_fast_bfloat16_gets_its_trials(tmp_path, machine_key):
    out, trials, _, _ = _tune(tmp_path, machine_key, 1.7, 0.88, "--trials", "3", "--no-confirm")
    policies = [t["config"]["policy"] for t in trials]
    assert policies[0] == "float32" and "mixed_bfloat16" in policies
    assert "mixed_float16" not in policies            # float16 0.88x: ruled out at this scale
    assert "has no fast" not in " ".join(out.split())
