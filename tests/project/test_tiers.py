"""The test tiers of tests/conftest.py hold: a test's tier is its own marker, else its file's
entry (the longest path wins), a test with two or with none is refused, and a unit test that
imports TensorFlow or Keras is stopped at the import, named, with where to move it."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TIER_OF_PATH, tier_of

PROBE = "tests/project/test_tiers.py::test_probe_a_unit_test_importing_keras"


def test_a_tests_tier_is_its_marker_else_its_files_longest_entry():
    assert tier_of("tests/project/test_structure.py", set()) == "unit"   # its own entry
    assert tier_of("tests/project/test_docs.py", set()) == "cli"         # tests/project/'s
    assert tier_of("tests/project/test_docs.py", {"slow"}) == "slow"     # its marker wins
    with pytest.raises(pytest.UsageError, match="carries the tiers"):
        tier_of("tests/project/test_docs.py", {"slow", "unit"})
    with pytest.raises(pytest.UsageError, match="is in no test tier"):
        tier_of("tests/nowhere/test_new.py", set())
    assert all(path.startswith("tests/") for path in TIER_OF_PATH)


@pytest.mark.unit
def test_probe_a_unit_test_importing_keras():
    """Not a test on its own: the import the next test makes a unit test attempt."""
    if os.environ.get("PT_TIER_PROBE") != "1":
        pytest.skip("a probe: run by test_a_unit_test_importing_keras_is_stopped_and_named")
    import keras  # noqa: F401 - the import is the probe


@pytest.mark.cli
def test_a_unit_test_importing_keras_is_stopped_and_named():
    """Mutation caught: tests/conftest.py's import hook appended to ``sys.meta_path`` rather
    than inserted first (the path finders find Keras before it: it never fires)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PT_TIER_PROBE": "1"})
    assert done.returncode != 0, done.stdout[-2000:]
    assert "is in the unit tier but imported keras: move it to the fast tier" in done.stdout, \
        done.stdout[-2000:]
