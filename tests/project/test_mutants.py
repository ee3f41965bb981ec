"""The mutation table (tests/support/mutants.py) stays runnable as the code moves: each mutant's
text is still in its module exactly once, and each test it names still exists. Running the
mutants themselves takes minutes (`make test-mutants`); this keeps the table honest in seconds."""

import ast

from tests.support.mutants import MUTANTS, ROOT


def _defined_tests(path):
    tree = ast.parse((ROOT / path).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_mutant_still_applies_once_to_its_module():
    stale = [f"{m.name}: {m.path} holds its text {(ROOT / m.path).read_text().count(m.old)} times"
             for m in MUTANTS if (ROOT / m.path).read_text().count(m.old) != 1]
    assert not stale, "\n".join(stale)


def test_every_test_a_mutant_names_exists():
    missing = []
    for mutant in MUTANTS:
        for node in mutant.tests:
            path, _, name = node.partition("::")
            if not (ROOT / path).is_file():
                missing.append(f"{mutant.name}: no file {path}")
            elif name and name.split("[")[0] not in _defined_tests(path):
                missing.append(f"{mutant.name}: no test {name} in {path}")
    assert not missing, "\n".join(missing)


def test_every_mutant_changes_its_module_and_has_a_catching_test():
    assert len({mutant.name for mutant in MUTANTS}) == len(MUTANTS)
    for mutant in MUTANTS:
        assert mutant.old != mutant.new and mutant.tests, mutant.name
