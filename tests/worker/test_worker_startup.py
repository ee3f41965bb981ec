"""The worker's one-time start-up (tuner.worker.process.startup), in a fresh interpreter: the
frameworks are imported, the collector skips what they left alive, and a task file can still
import the packages Keras was kept from importing."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, json, sys
from tuner.worker.process.startup import import_frameworks
import_frameworks()
seen = {"keras": "keras" in sys.modules, "tensorflow": "tensorflow" in sys.modules,
        "frozen": gc.get_freeze_count(),
        "hidden_left": [m for m in ("sklearn", "matplotlib") if sys.modules.get(m, 0) is None]}
importable = {}
for name in ("sklearn", "matplotlib"):
    try:
        module = __import__(name)
        importable[name] = hasattr(module, "__version__")
    except ModuleNotFoundError:
        importable[name] = "not installed"
seen["importable"] = importable
import keras
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
seen["model_params"] = model.count_params()
print(json.dumps(seen))
"""


def test_frameworks_are_imported_frozen_and_hidden_packages_stay_importable():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=300, cwd=ROOT,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["keras"] and seen["tensorflow"]
    assert seen["frozen"] > 100_000  # the frameworks' objects sit in the permanent generation
    assert seen["hidden_left"] == []
    assert all(value in (True, "not installed") for value in seen["importable"].values())
    assert seen["model_params"] == 8
