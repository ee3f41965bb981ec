"""The layering the design promises: the driver never imports TensorFlow."""

import subprocess
import sys

DRIVER = ["tuner.cli", "tuner.plan", "tuner.proposer", "tuner.scheduler", "tuner.remeasure",
          "tuner.decision", "tuner.noise", "tuner.job", "tuner.tracking", "tuner.report",
          "tuner.space", "tuner.space_yaml", "tuner.placement", "tuner.commands",
          "tuner.progress", "tuner.executor", "tuner.ray_executor", "tuner.results"]


def test_driver_modules_do_not_import_tensorflow_or_keras():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in DRIVER)
            + "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"
