"""What a statement imports, seen from a fresh interpreter: the tests that hold a light entry
point to staying light (the CLI, ``from tuner import ...``, the version check) ask here."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("tensorflow", "keras", "mlflow", "ray", "optuna")


def loaded_after(statement: str, watched: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of ``watched`` loaded once ``statement`` has run in a new interpreter (in the
    repository root); an AssertionError with its stderr where the statement fails."""
    code = f"import sys\n{statement}\nprint(sorted(m for m in {watched!r} if m in sys.modules))"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=120, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr
    return ast.literal_eval(completed.stdout.strip().splitlines()[-1])
