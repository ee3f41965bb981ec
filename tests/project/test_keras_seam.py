"""Keras's private parts stay behind one seam, tuner/apply/keras_internals.py: no other module
under tuner/ imports from ``keras.src`` or names a private Keras attribute.

A private Keras name is one the seam declares (``KERAS_PRIVATE_NAMES``), found anywhere outside
it as an attribute (``layer._losses``), a string (``getattr(layer, "_losses")``) or a method
defined under that name (an override of Keras's hook); or any ``_``-prefixed attribute read from
something the module got from Keras (``keras.<...>._x``, or a name imported from keras). The
project's own ``_private`` helpers are none of these. Each rule is shown to catch what it is for
on a snippet, so that a rule that stopped working fails here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tuner"
SEAM = PACKAGE / "apply" / "keras_internals.py"


def _declared_private_names() -> frozenset[str]:
    # Read from the seam's source, so that this test needs no Keras import.
    for node in ast.walk(ast.parse(SEAM.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "KERAS_PRIVATE_NAMES"
                                                for target in node.targets):
            return frozenset(ast.literal_eval(node.value.args[0]))
    raise AssertionError("tuner/apply/keras_internals.py declares no KERAS_PRIVATE_NAMES")


PRIVATE = _declared_private_names()


def _keras_names(tree: ast.Module) -> set[str]:
    """Local names bound to Keras: ``import keras`` and ``from keras... import x``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names
                      if alias.name.split(".")[0] == "keras"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "keras":
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _own_attributes(tree: ast.Module) -> set[str]:
    """Attributes the module itself assigns on ``self`` (``self._losses = ...``): the project's
    own, even where Keras has one of the same name."""
    return {target.attr for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            and target.value.id == "self"}


def seam_breaches(source: str) -> list[str]:
    """What in ``source`` reaches past the seam, one line each."""
    tree = ast.parse(source)
    keras = _keras_names(tree)
    own = _own_attributes(tree)
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras.src"):
            found.append(f"{line}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"{line}: import {alias.name}" for alias in node.names
                      if alias.name.startswith("keras.src")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            mine = isinstance(node.value, ast.Name) and node.value.id == "self" \
                and node.attr in own
            if node.attr in PRIVATE and not mine:
                found.append(f"{line}: .{node.attr} (a private Keras name)")
            elif _root_name(node.value) in keras:
                found.append(f"{line}: {ast.unparse(node)} (a private attribute of Keras)")
        elif isinstance(node, ast.Attribute) and node.attr == "src" \
                and isinstance(node.value, ast.Name) and node.value.id in keras:
            found.append(f"{line}: {ast.unparse(node)} (Keras's private package)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and (node.value in PRIVATE or node.value.startswith("keras.src")):
            found.append(f"{line}: {node.value!r} (a private Keras name as a string)")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in PRIVATE:
            found.append(f"{line}: def {node.name} (overrides a private Keras method)")
    return found


def test_the_seam_declares_the_private_names_it_uses():
    assert PRIVATE, "KERAS_PRIVATE_NAMES is empty"
    text = SEAM.read_text()
    assert all(name in text.replace("KERAS_PRIVATE_NAMES", "").split("frozenset({", 1)[1]
               .split("})", 1)[1] for name in PRIVATE), \
        "a name in KERAS_PRIVATE_NAMES that the seam does not use: remove it"


def test_no_module_outside_the_seam_reaches_keras_internals():
    breaches = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == SEAM:
            continue
        found = seam_breaches(path.read_text())
        if found:
            breaches[str(path.relative_to(ROOT))] = found
    assert not breaches, ("Keras internals outside tuner/apply/keras_internals.py (move them "
                          f"into it, saying what they rely on and since which Keras): {breaches}")


# Private names of the standard library and of other packages that tuner/ uses on purpose.
NOT_KERAS = {"_exit", "_getframe", "_replace", "_actions", "_choices_actions", "_add_action",
             "_HelpAction", "_SubParsersAction"}


def _project_names() -> set[str]:
    """Every ``_``-prefixed name the project defines: attributes it assigns, its functions,
    methods and classes. What is private and not among them comes from a library."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {name for name in names if name.startswith("_")} - PRIVATE


def test_a_private_attribute_the_project_does_not_define_is_keras_s():
    """In the two packages that import Keras, a private attribute that no tuner module defines
    is a library's: a new private Keras name the seam does not list yet is caught here."""
    own = _project_names() | NOT_KERAS
    found = {}
    for package in ("apply", "worker"):
        for path in sorted((PACKAGE / package).rglob("*.py")):
            if path == SEAM:
                continue
            tree = ast.parse(path.read_text())
            mine = own | _own_attributes(tree)
            names = sorted({f"{node.lineno}: .{node.attr}" for node in ast.walk(tree)
                            if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                            and not node.attr.startswith("__") and node.attr not in mine})
            if names:
                found[str(path.relative_to(ROOT))] = names
    assert not found, ("private attributes no tuner module defines, presumably Keras's: move "
                       f"them into tuner/apply/keras_internals.py (or, if not Keras's, into "
                       f"NOT_KERAS here): {found}")


@pytest.mark.parametrize("snippet", [
    "from keras.src.models.functional import Functional",
    "import keras.src.backend.common.global_state",
    "def f(layer):\n    return layer._losses",
    "import keras\nclass L(keras.layers.Layer):\n    def f(self):\n        return self._losses",
    "def f(model):\n    return getattr(model, '_compile_loss', None)",
    "import keras\nclass O(keras.optimizers.LossScaleOptimizer):\n"
    "    def _tf_apply(self, g):\n        pass",
    "import keras\nx = keras.layers.Dense(1)._tracker",
    "from keras import ops\nops._private_helper()",
    "import keras\nm = keras.src.models.Model",
])
def test_the_rule_catches(snippet):
    assert seam_breaches(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "class A:\n    def __init__(self):\n        self._batch = None\n"
    "    def f(self):\n        return self._batch",
    "def f(placer):\n    return placer._active",
    "import keras\nkeras.layers.Dense(1).__class__",
    "import argparse\nargparse._HelpAction",
    "class W:\n    def __init__(self):\n        self._losses = []\n"
    "    def f(self):\n        return self._losses",
])
def test_the_rule_leaves_the_projects_own_private_names_alone(snippet):
    assert not seam_breaches(snippet), snippet
