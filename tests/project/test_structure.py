"""The layering the design promises, read from the source (AST), not from a hand-kept list.

- Subpackages by role, in one order: a module imports only from its own layer or the layers
  below it (``LAYERS``). Core modules (``tuner/*.py``) are the bottom; the package's own
  ``__init__`` (the public API) and ``__main__`` the top. A layer kept in sub-packages by role
  (``ROOMS``: the worker's) holds them in one order too.
- Only ``tuner.apply`` and ``tuner.worker`` import TensorFlow or Keras (the driver never does).
- No cycles among the modules' top-level imports, and no function-local import of a tuner
  module except to defer a heavy third-party import (TensorFlow, Keras, Ray, MLflow, Optuna,
  matplotlib, rich, ...), or where ``DEFERRED`` says why (a command's whole stack, which the
  other commands need not import).
- No module over 300 lines and no function over 60 without a reason at the module's top
  (a line of its docstring containing "Past 300 lines" or "Past 60 lines").
- Every subpackage says what it owns, and no two modules share a file name.
- Every ``noqa`` and ``type: ignore`` in the code, the tests, the benchmarks and the examples
  names its codes and says why.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from tests.support.fresh_imports import loaded_after

PACKAGE = Path(__file__).resolve().parents[2] / "tuner"
LAYERS = ["core", "apply", "judging", "search", "records", "worker", "execution", "run",
          "service", "api", "cli", "public"]   # public: the package's own __init__ and __main__
# A layer's sub-packages by role, bottom first: each imports only from itself and those before it.
ROOMS = {"worker": ["task", "device", "diagnostics", "trial", "check", "process", "programs"]}
HEAVY = {"tensorflow", "keras", "ray", "mlflow", "optuna", "matplotlib", "rich", "numpy",
         "selenium", "pandas"}
TENSORFLOW = {"tensorflow", "keras"}
# (importer, imported): function-local imports of tuner modules that import nothing heavy,
# each with its reason.
DEFERRED = {
    ("tuner.api.tuning", "tuner.api.job"): "the tune job's stack (0.15 s of imports): "
                                           "`import tuner` and help(tuner.tune) do not run it",
    ("tuner.cli.app", "tuner.api.job"): "the tune job's stack: submit and the job commands do "
                                        "not run it",
    ("tuner.cli.app", "tuner.cli.commands"): "the small commands (export, ui, diagnose, "
                                             "spaces, train, bench) import the executors",
    ("tuner.cli.app", "tuner.cli.service_commands"): "the service's server side",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _layer(module: str) -> str:
    if module in ("tuner", "tuner.__main__"):
        return "public"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "core"


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported module, at top level?, line) for every import in the file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        # Imports under `if TYPE_CHECKING:` are for annotations: never executed.
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names
                          if f"{node.module}.{alias.name}" in MODULES]
            # `from package import submodule` imports the submodule (and runs the package's
            # __init__, which must then not import back: checked as its own module).
            names = submodules if len(submodules) == len(node.names) else \
                [node.module] + submodules
        for name in names:
            found.append((name, id(node) in top, node.lineno))
    return found


def _internal(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _room(module: str) -> str:
    """The sub-package by role a module stands in, where its layer has them (``ROOMS``)."""
    parts = module.split(".")
    return parts[2] if _layer(module) in ROOMS and len(parts) > 2 else ""


def _rank(module: str) -> tuple[int, int]:
    rooms = ROOMS.get(_layer(module), [])
    return LAYERS.index(_layer(module)), rooms.index(_room(module)) if _room(module) else -1


def test_imports_point_one_way():
    wrong = [f"{path.relative_to(PACKAGE.parent)}: not in a sub-package that ROOMS orders"
             for module, path in MODULES.items()
             if _room(module) and _room(module) not in ROOMS[_layer(module)]]
    for module, path in MODULES.items():
        for name, _, line in _imports(path):
            target = _internal(name) if name.startswith("tuner") else None
            if target and target != "tuner" and _rank(target) > _rank(module):
                where = {m: _layer(m) + (f"/{_room(m)}" if _room(m) else "")
                         for m in (module, target)}
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({where[module]}) "
                             f"imports {target} ({where[target]})")
    assert not wrong, "\n".join(wrong)


def test_only_apply_and_worker_import_tensorflow_or_keras():
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
             for module, path in MODULES.items() if _layer(module) not in ("apply", "worker")
             for name, _, line in _imports(path) if name.split(".")[0] in TENSORFLOW]
    assert not wrong, "\n".join(wrong)


def _top_level_graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        graph[module] = {target for name, top, _ in _imports(path) if top and
                         name.startswith("tuner") and (target := _internal(name))
                         and target not in (module, "tuner")}
    return graph


def test_no_import_cycles():
    graph, state, cycles = _top_level_graph(), {}, []

    def visit(node, stack):
        state[node] = "open"
        for target in graph.get(node, ()):
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[node] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


def _heavy_at_import(module: str, seen: set[str] | None = None) -> bool:
    """Does importing ``module`` import a heavy third-party package (transitively)?"""
    seen = seen if seen is not None else set()
    if module in seen or module not in MODULES:
        return False
    seen.add(module)
    for name, top, _ in _imports(MODULES[module]):
        if not top:
            continue
        if name.split(".")[0] in HEAVY:
            return True
        target = _internal(name) if name.startswith("tuner") else None
        if target and _heavy_at_import(target, seen):
            return True
    return False


def test_function_local_imports_of_tuner_modules_only_defer_heavy_packages():
    """A function-local ``from tuner.x import y`` is allowed only where importing ``tuner.x``
    at the top would import a heavy package (so ``--help`` and config validation stay instant),
    never to get around a cycle."""
    wrong = []
    for module, path in MODULES.items():
        for name, top, line in _imports(path):
            target = _internal(name) if name.startswith("tuner") else None
            if not top and target and target != "tuner" and not _heavy_at_import(target) \
                    and (module, target) not in DEFERRED:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} "
                             "inside a function, though it imports nothing heavy: import it "
                             "at the top")
    assert not wrong, "\n".join(wrong)


MAX_LINES = 400   # a module past it is split, whatever its docstring says


def _reason(path: Path, what: str) -> bool:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return what in docstring


def _lines_outside_imports(path: Path) -> int:
    """A module's lines less its import statements: ruff's isort writes a long import one name
    a line, which says what a module uses, not how much it does."""
    tree = ast.parse(path.read_text())
    imports = sum(node.end_lineno - node.lineno + 1 for node in tree.body
                  if isinstance(node, (ast.Import, ast.ImportFrom)))
    return len(path.read_text().splitlines()) - imports


def test_modules_and_functions_stay_small_or_say_why():
    wrong = []
    for module, path in MODULES.items():
        lines = _lines_outside_imports(path)
        if lines > MAX_LINES:
            wrong.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines, over the "
                         f"{MAX_LINES}-line limit that no reason lifts: split it along a role")
        elif lines > 300 and not _reason(path, "Past 300 lines"):
            wrong.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 60 and not _reason(path, "Past 60 lines"):
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                                 f"{node.name}: {length} lines")
    assert not wrong, "\n".join(wrong)


def test_every_subpackage_says_what_it_owns():
    subpackages = LAYERS[1:-1] + [f"{layer}/{room}" for layer in ROOMS for room in ROOMS[layer]]
    for subpackage in subpackages:
        init = PACKAGE / subpackage / "__init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring) > 100, subpackage
    names: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.name, []).append(module)
    shared = {name: found for name, found in names.items() if len(found) > 1}
    assert not shared, f"modules that share a file name: {shared}"
    # tests/ mirrors the package (docs/contributing/tests.md): only conftest.py at its top
    loose = sorted(path.name for path in (PACKAGE.parent / "tests").glob("*.py")
                   if path.name not in ("conftest.py", "__init__.py"))
    assert not loose, f"test files at the top of tests/, not beside what they test: {loose}"
    missing = [folder for folder in LAYERS[1:-1]
               if not (PACKAGE.parent / "tests" / folder).is_dir()]
    assert not missing, f"packages without their folder under tests/: {missing}"


@pytest.mark.cli  # imports in a fresh interpreter
def test_the_driver_imports_no_tensorflow_or_keras():
    """Importing every module outside apply/ and worker/ (the driver's whole code) leaves
    TensorFlow and Keras unloaded."""
    driver = [m for m in MODULES if _layer(m) not in ("apply", "worker") and m != "tuner.__main__"]
    statement = "".join(f"import {m}\n" for m in sorted(driver))
    assert loaded_after(statement, ("tensorflow", "keras")) == []


@pytest.mark.cli  # imports in a fresh interpreter
def test_the_public_config_import_stays_light():
    assert loaded_after("from tuner import PrecisionConfig") == []


@pytest.mark.cli  # imports in a fresh interpreter
def test_the_submit_and_job_entrypoint_paths_import_no_heavy_package():
    """``precision-tuner submit`` (the parser and the job commands) and a service job's
    entrypoint (tuner.cli.handoff) are what a user waits on: neither imports Ray, MLflow,
    Optuna, TensorFlow or the tune job (Ray's job client alone took 0.75 s of a 1.2 s
    submit; the whole package 0.2 s of each job's start)."""
    watched = ("ray", "mlflow", "optuna", "tensorflow", "keras", "rich", "tuner.api.job")
    for module in ("tuner.cli.app", "tuner.cli.jobs", "tuner.cli.handoff"):
        assert loaded_after(f"import {module}", watched) == [], module
    assert loaded_after("import tuner.cli.handoff", ("tuner.cli.app",)) == []


def test_the_400_line_limit_holds_for_a_module_with_a_reason(monkeypatch, tmp_path):
    """The hard limit is not lifted by a "Past 300 lines" reason."""
    big = tmp_path / "big.py"
    big.write_text('"""Past 300 lines: a reason."""\n' + "x = 1\n" * MAX_LINES)
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "MODULES", {"tuner.big": big})
    monkeypatch.setattr(here, "PACKAGE", tmp_path / "tuner")
    with pytest.raises(AssertionError, match="over the 400-line limit"):
        test_modules_and_functions_stay_small_or_say_why()


# -- every suppression says why -----------------------------------------------------------------
# Every line that silences ruff or mypy, wherever it stands (a comment, or a script a test holds
# in a string), names what it silences and says why, in the form each tool still reads:
# ruff's ``# noqa: BLE001 - why`` and mypy's ``# type: ignore[attr-defined]  # why`` (mypy
# takes nothing after the codes but another comment: a dash and a reason there is an invalid
# ignore to it, reported as an error).
SUPPRESSING = ("tuner", "tests", "benchmarks", "examples")
_NOQA = re.compile(r"#\s*noqa\b(?P<codes>:\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(?P<rest>.*)")
_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<codes>\[[a-z-]+(?:\s*,\s*[a-z-]+)*\])?"
                     r"(?P<rest>.*)")
_REASON = {_NOQA: re.compile(r"\s+-\s+\S"), _IGNORE: re.compile(r"\s+#\s*\S")}
# The markers in pieces, so that the rule, which reads this file's lines too, sees them only in
# the examples and the message it is handed.
NOQA, IGNORE = "# no" "qa", "# type: ig" "nore"


def unexplained_suppressions(text: str) -> list[int]:
    """The numbers of the lines of ``text`` whose ``noqa`` or ``type: ignore`` names no code
    or gives no reason after its codes."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, reason in _REASON.items():
            match = pattern.search(line)
            if match and not (match["codes"] and reason.match(match["rest"])):
                found.append(number)
    return found


def test_every_noqa_and_type_ignore_says_why():
    root = PACKAGE.parent
    wrong = [f"{path.relative_to(root)}:{number}: {path.read_text().splitlines()[number - 1]}"
             for folder in SUPPRESSING for path in sorted((root / folder).rglob("*.py"))
             for number in unexplained_suppressions(path.read_text())]
    assert not wrong, ("a suppression without its code(s) or its reason; write "
                       f"`{NOQA}: CODE - why` or `{IGNORE}[code]  # why`:\n" + "\n".join(wrong))


@pytest.mark.parametrize("line", [
    f"import os  {NOQA}",
    f"import os  {NOQA}: F401",
    f"except Exception:  {NOQA}: BLE001 -",
    f"except Exception:  {NOQA}: BLE001 E501",
    f"x = y  {IGNORE}",
    f"x = y  {IGNORE}[assignment]",
    f"x = y  {IGNORE}[assignment] - what mypy refuses",
    f"x = y  {IGNORE}  # why, but no code",
])
def test_the_suppression_rule_catches(line):
    assert unexplained_suppressions(f"import sys\n{line}\n") == [2], line


@pytest.mark.parametrize("line", [
    f"import os  {NOQA}: F401 - re-exported",
    f"import os  {NOQA}: E402, F401 - after the path is set",
    f"x = y  {IGNORE}[assignment]  # Keras sets it at build",
    f"x = y  {IGNORE}[attr-defined, assignment]  # why",
    "# the noqa rule and type: ignore comments, in prose",
])
def test_the_suppression_rule_takes_a_reason(line):
    assert not unexplained_suppressions(line), line
