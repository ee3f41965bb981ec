import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The device's ceiling figures are kept per machine (tuner.worker.device.ceiling_cache): the suite
# keeps its own, fresh for each run, never the developer's.
if "PRECISION_TUNER_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["PRECISION_TUNER_CACHE_DIR"] = tempfile.mkdtemp(prefix="precision-tuner-cache-")

TASKS = Path(__file__).parent / "fixtures" / "tasks"
ROOT = Path(__file__).parent.parent


def not_injectable(why: str) -> None:
    """Skip a fault or network test this machine cannot run (no cgroup memory controller, no
    ``chattr``, no network namespace), as the fault summary then counts it; under
    ``PT_REQUIRE_FAULTS=1`` (set by ``.ci/run``, whose machine runs them all) that fails."""
    if os.environ.get("PT_REQUIRE_FAULTS") == "1":
        pytest.fail(f"{why}; PT_REQUIRE_FAULTS=1 requires every fault and network test to run")
    pytest.skip(why)


@pytest.fixture
def task_path():
    return lambda name: str(TASKS / f"{name}.py")


@pytest.fixture(scope="session")
def tuned(tmp_path_factory):
    """One real tuning job through the CLI, shared by the end-to-end and browser tests."""
    tmp = tmp_path_factory.mktemp("e2e")
    run_dir, out = tmp / "run", tmp / "best.yaml"
    completed = subprocess.run(
        [sys.executable, "-m", "tuner", "tune", str(TASKS / "tiny_mlp.py"), "--space", "quick",
         "--trials", "6", "--steps", "14", "--run-dir", str(run_dir), "--out", str(out),
         "--keep-slow-policies"],  # float16 too, also where this CPU's ceiling would skip it
        capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return run_dir, out, completed.stdout
