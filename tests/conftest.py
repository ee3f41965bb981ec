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


# -- Tiers -------------------------------------------------------------------------------------
# Every test is in exactly one tier, which ``-m`` selects:
#   unit    no model, no TensorFlow, no subprocess: pure rules and plain data (seconds in all)
#   fast    TensorFlow in this process, tiny models, a few steps each
#   cli     a command or program in a subprocess (the CLI's refusals, the docs build, snippets)
#   slow    real trainings and tunes end to end (seconds to minutes each)
#   system  Ray, the service, the browser, injected faults: the machine's own processes
# and a few slow tests are also ``canary``: alone they catch a core regression (see CANARIES).
# `make test-quick` runs unit, fast, cli and canary; `make test` runs everything.
#
# A test's tier is its own marker where it has one (``@pytest.mark.slow``, or a module's
# ``pytestmark``), else its file's entry below (the longest matching path wins). A test file
# that no entry covers fails collection: no test escapes the tiers.
TIERS = ("unit", "fast", "cli", "slow", "system")
TIER_OF_PATH = {
    "tests/api/": "fast",
    "tests/api/test_interrupt.py": "unit",
    "tests/api/test_progress.py": "unit",
    "tests/api/test_result_frame.py": "unit",
    "tests/apply/": "fast",
    "tests/apply/test_config.py": "unit",
    "tests/apply/guard/test_watch.py": "unit",
    "tests/apply/loaded/test_reach_rules.py": "unit",
    # Every loaded kind against its twin, every example's inputs, every task check: minutes
    # together on a 2-core CPU without bfloat16 units, beyond the quick tier's five.
    "tests/apply/loaded/test_loaded_dtypes.py": "slow",
    "tests/apply/test_keras_apply.py": "slow",
    "tests/cli/": "cli",
    "tests/cli/test_handoff.py": "system",        # spare workers kept warm by a keeper
    "tests/e2e/": "slow",
    "tests/e2e/test_ui_browser.py": "system",
    "tests/execution/": "unit",
    "tests/execution/test_fate.py": "cli",
    "tests/execution/test_local_worker.py": "system",
    "tests/execution/test_ray.py": "system",
    "tests/judging/": "unit",
    "tests/project/": "cli",
    "tests/project/test_structure.py": "unit",
    "tests/project/test_keras_seam.py": "unit",
    "tests/project/test_dependency_ranges.py": "unit",
    "tests/project/test_mutants.py": "unit",
    "tests/project/test_tiers.py": "unit",
    "tests/records/": "unit",
    "tests/records/test_tracking.py": "fast",       # MLflow's store in-process (it runs uname)
    "tests/records/test_record_order.py": "fast",
    "tests/run/": "unit",
    "tests/run/test_timing.py": "fast",
    "tests/run/test_bench.py": "cli",
    "tests/search/": "unit",
    "tests/service/": "system",
    "tests/service/test_job_server.py": "unit",
    "tests/service/test_job_book.py": "unit",
    "tests/service/test_job_status.py": "unit",
    "tests/suites/faults/": "system",
    "tests/suites/quality/": "slow",
    "tests/suites/zoo/": "slow",      # every model kind trained: minutes together
    "tests/worker/": "fast",
    "tests/worker/test_own_compile.py": "slow",   # GANs and WGAN-GP trained, one by one
    "tests/worker/test_live.py": "slow",
    "tests/worker/test_worker_startup.py": "slow",
    "tests/worker/test_continuous_inputs.py": "slow",
    "tests/worker/test_task_check.py": "slow",
    "tests/worker/test_warm_worker_memory.py": "slow",
}
# Slow tests that alone catch a core regression, in the quick tier (node ids, a parametrised
# test by its full id): a loaded model's trial, an unreached trial, the guard's NaN restore,
# precision loss found at its cause, a tune that stops on a failing run.
CANARIES = {
    "tests/apply/loaded/test_loaded_trials.py::"
    "test_a_loaded_models_mixed_trial_computes_in_bfloat16[functional_keras]",
    "tests/apply/loaded/test_loaded_trials.py::"
    "test_layers_built_with_float32_in_code_fail_as_unreached",
    "tests/apply/guard/test_guard.py::"
    "test_a_nan_injected_mid_training_is_survived_with_the_weights_restored[True]",
    "tests/apply/guard/test_precision_loss.py::"
    "test_precision_loss_is_found_at_its_cause_and_the_policy_kept[kelvin_head]",
    "tests/apply/guard/test_train_command.py::test_a_failing_config_run_stops_the_float32_run",
    "tests/apply/guard/test_loop_guard.py::"
    "test_a_nan_in_a_custom_loop_is_survived_with_the_weights_restored",
}


def tier_of(relpath: str, own: set[str]) -> str:
    """The tier of a test in the file ``relpath`` (from the repository root) that carries the
    tier markers ``own``; a one-line error where it has two, or its file no entry."""
    if len(own) > 1:
        raise pytest.UsageError(f"{relpath}: a test carries the tiers {sorted(own)}; a test is "
                                "in exactly one tier (tests/conftest.py TIERS)")
    if own:
        return own.pop()
    covering = [path for path in TIER_OF_PATH if relpath.startswith(path)]
    if not covering:
        raise pytest.UsageError(f"{relpath} is in no test tier: add its path to TIER_OF_PATH "
                                "in tests/conftest.py")
    return TIER_OF_PATH[max(covering, key=len)]


def pytest_configure(config):
    for tier, what in (("unit", "no model, no TensorFlow, no subprocess"),
                       ("fast", "TensorFlow in-process, tiny models"),
                       ("cli", "a command or program in a subprocess"),
                       ("slow", "real trainings and tunes end to end"),
                       ("system", "Ray, the service, the browser, injected faults"),
                       ("canary", "a slow test in the quick tier: alone it catches a core "
                                  "regression")):
        config.addinivalue_line("markers", f"{tier}: {what}")


def _unit_only() -> bool:
    # `make test-quick` runs the unit tier on its own first (PT_UNIT_ONLY=1): only the files
    # whose entry is unit are collected, so that an import of TensorFlow by any of them shows.
    return os.environ.get("PT_UNIT_ONLY") == "1"


def pytest_ignore_collect(collection_path, config):
    if not _unit_only() or collection_path.is_dir() or collection_path.suffix != ".py" \
            or not collection_path.name.startswith("test_"):
        return None
    relpath = collection_path.relative_to(ROOT).as_posix()
    try:
        return tier_of(relpath, set()) != "unit" or None
    except pytest.UsageError:
        return None   # collected, so that the error shows


_IMPORTED_TENSORFLOW: list[str] = []   # the first unit file after whose collection TF was there


def pytest_collectreport(report):
    if _unit_only() and not _IMPORTED_TENSORFLOW and report.nodeid.endswith(".py") \
            and "tensorflow" in sys.modules:
        _IMPORTED_TENSORFLOW.append(report.nodeid)


def pytest_collection_modifyitems(config, items):
    found_canaries, files = set(), set()
    for item in items:
        relpath = item.path.relative_to(ROOT).as_posix()
        files.add(relpath)
        tier = tier_of(relpath, {mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if not item.get_closest_marker(tier):
            item.add_marker(tier)
        if item.nodeid in CANARIES:
            if tier not in ("slow", "system"):
                raise pytest.UsageError(f"{item.nodeid} is a canary in the {tier} tier: a "
                                        "canary is a slow or system test (the others run "
                                        "in the quick tier anyway)")
            item.add_marker("canary")
            found_canaries.add(item.nodeid)
    # A canary renamed away would leave the quick tier without it, silently: where its whole
    # file was collected, it must be there.
    if not config.option.keyword and not any("::" in arg for arg in config.args):
        missing = {canary for canary in CANARIES - found_canaries
                   if canary.split("::")[0] in files}
        if missing:
            raise pytest.UsageError(f"CANARIES names tests that do not exist: {sorted(missing)}")


class TierViolation(BaseException):
    """A unit test did what only the other tiers may (a BaseException, so that the code under
    test cannot catch it as an ordinary failure)."""


@pytest.fixture(autouse=True)
def _unit_tests_stay_units(request, monkeypatch):
    """A unit test that starts a subprocess, or imports TensorFlow, is in the wrong tier."""
    if not request.node.get_closest_marker("unit"):
        yield
        return
    name = request.node.nodeid

    def no_subprocess(self, args, *rest, **kwargs):
        raise TierViolation(f"{name} is in the unit tier but started a subprocess ({args!r}): "
                            "move it to the cli tier in tests/conftest.py TIER_OF_PATH")

    monkeypatch.setattr(subprocess.Popen, "__init__", no_subprocess)
    if _unit_only() and "tensorflow" in sys.modules:
        culprit = (f"by {_IMPORTED_TENSORFLOW[0]} at its import" if _IMPORTED_TENSORFLOW
                   else "by an earlier unit test")
        raise TierViolation(f"TensorFlow was imported before {name} ran ({culprit}): a unit "
                            "test uses no TensorFlow; move that file to the fast tier in "
                            "tests/conftest.py TIER_OF_PATH")
    finder = _NoTensorFlow(name) if "tensorflow" not in sys.modules else None
    if finder is not None:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder is not None:
            sys.meta_path.remove(finder)


class _NoTensorFlow:
    """An import hook that refuses TensorFlow (and Keras, which imports it) to a unit test."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in ("tensorflow", "keras"):
            raise TierViolation(f"{self.name} is in the unit tier but imported {fullname}: "
                                "move it to the fast tier in tests/conftest.py TIER_OF_PATH")
        return None


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
