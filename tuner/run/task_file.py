"""Static checks of a task file, without importing it (so no TensorFlow in the driver).

The task-file contract (docs/how-to/task-files.md): ``build_model()``, ``train_data()`` and
``LOSS`` are required; ``make_optimizer()``, ``BATCH_SIZE``, ``METRICS``, ``val_data()`` and
``val_metric(model)`` are optional. A task that compiles its model itself
(``compile_model(model, wrap_optimizer)``: a GAN, any model with its own ``compile``) or hands
the tuner its own training step (``train_step(model, optimizer, batch)``: a custom loop's)
needs no ``LOSS``.
The worker checks what only running the code can show (what ``train_data()`` returns).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from tuner.dependency_versions import declared_range
from tuner.errors import TaskError, UsageError

REQUIRED = ("build_model", "train_data", "LOSS")
OPTIONAL = ("make_optimizer", "BATCH_SIZE", "METRICS", "val_data", "val_metric", "compile_model",
            "train_step", "CLASS_WEIGHT")
# Either of these trains the model with losses of its own: LOSS is then optional.
OWN_TRAINING = ("compile_model", "train_step")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            # Definitions under `if`/`try` count too (e.g. optional imports).
            names |= _top_level_names(ast.Module(body=list(ast.iter_child_nodes(node)),
                                                 type_ignores=[]))
    return names


def check_task_file(path: str | Path) -> Path:
    """Return the resolved path, or raise TaskError naming what is missing and how to fix it."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"task file not found: {str(path)!r}. Pass the path to a Python file "
                        "defining build_model(), train_data() and LOSS.")
    if path.suffix != ".py":
        raise TaskError(f"task file must be a Python file (.py). Received: {str(path)!r}")
    source = path.read_text()
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise TaskError(f"task file {path} has a syntax error at line {exc.lineno}: {exc.msg}. "
                        "Fix the file and try again.") from None
    names = _top_level_names(tree)
    has_star_import = any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)
                          for n in tree.body)
    missing = [name for name in REQUIRED if name not in names
               and not (name == "LOSS" and names.intersection(OWN_TRAINING))]
    if missing and not has_star_import:
        raise TaskError(f"task file {path} does not define {', '.join(missing)}. A task file must "
                        "define build_model(), train_data() and LOSS, or compile_model(model, "
                        "wrap_optimizer) or train_step(model, optimizer, batch) instead of LOSS "
                        "(see docs/how-to/task-files.md).")
    return path.resolve()


def require_tensorflow() -> None:
    """TensorFlow is an extra (``[cpu]`` or ``[gpu]``: the right build for the machine), so an
    install without one is refused here, in one line, before a worker fails on its import.
    Looks the package up without importing it. The command it names installs into this very
    interpreter, the build the ``cpu`` extra would choose here (``tensorflow_requirement``)."""
    if importlib.util.find_spec("tensorflow") is None:
        python = sys.executable if " " not in sys.executable else f'"{sys.executable}"'
        raise UsageError(f"TensorFlow is not installed in this environment. Install it: "
                         f"{python} -m pip install \"{tensorflow_requirement()}\" (an NVIDIA "
                         "GPU on Linux: "
                         f"\"tensorflow[and-cuda]{_tensorflow_range('tensorflow')}\"; "
                         "docs/install.md)")


def tensorflow_requirement(machine: str | None = None, system: str | None = None) -> str:
    """What the ``cpu`` extra installs on this platform (pyproject.toml's markers say the
    same): ``tensorflow-cpu`` where it has wheels (x86-64 Linux and Windows), plain
    ``tensorflow`` elsewhere (Apple silicon, ARM Linux, Intel macOS)."""
    import platform

    machine = (machine or platform.machine()).lower()
    system = system or sys.platform
    cpu_wheel = machine in ("x86_64", "amd64") and system != "darwin"
    name = "tensorflow-cpu" if cpu_wheel else "tensorflow"
    return f"{name}{_tensorflow_range(name)}"


def _tensorflow_range(name: str) -> str:
    return declared_range(name, source_tree=">=2.16.1,<3")  # pyproject.toml's, uninstalled
