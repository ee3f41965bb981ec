"""Print the project's dependencies pinned at their declared lower bounds, one a line, as pip
constraints (``pip install -c``) for ``make test-lowest``.

The floors are read from pyproject.toml, the one place they are declared: each ``>=X`` becomes
``==X`` and any other bound of the same requirement is dropped; the environment marker is kept
and the extras are not (pip refuses extras in a constraint; the project's own requirements still
ask for them) (so ``[cpu]`` gives ``tensorflow-cpu==2.16...`` on x86-64 Linux and ``tensorflow``
elsewhere). A requirement without a lower bound is left out (pip resolves it). The extras named on the
command line (default: ``cpu``) are included with the base dependencies.

    python .ci/lowest_requirements.py [EXTRA ...]
"""

from __future__ import annotations

import pathlib
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10, the lowest the project admits: its backport
    import tomli as tomllib

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parent.parent


def pinned_at_floor(text: str) -> str:
    """``text`` (a PEP 508 requirement) with its ``>=`` bound turned into ``==``."""
    requirement = Requirement(text)
    floors = [spec.version for spec in requirement.specifier if spec.operator == ">="]
    if not floors:
        return ""
    marker = f"; {requirement.marker}" if requirement.marker else ""
    return f"{requirement.name}=={floors[0]}{marker}"


def lowest_requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in extras:
        declared += project["optional-dependencies"][extra]
    return [line for line in map(pinned_at_floor, declared) if line]


if __name__ == "__main__":
    print("\n".join(lowest_requirements(sys.argv[1:] or ["cpu"])))
