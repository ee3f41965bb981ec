"""Whether the installed Keras, TensorFlow, Optuna, Ray and MLflow are inside the range
precision-tuner declares, said in one line per package with the pip command that fixes it.

The ranges are read from the installed distribution's own metadata (what pyproject.toml
declared when it was built), never from a second list here. Where precision-tuner runs from a
source tree without being installed, or a package is not installed at all, there is nothing to
check (a missing TensorFlow has its own line: tuner.run.task_file). ``make test-lowest`` runs the
floors; past the upper bounds nothing was tried (tuner.apply.keras_internals says why Keras's
matters).
"""

from __future__ import annotations

import functools
import warnings
from importlib import metadata

from tuner.errors import UsageError

DISTRIBUTION = "precision-tuner"
# The packages whose range is checked, by their import name; TensorFlow is one of two wheels.
CHECKED = {"keras": ("keras",), "tensorflow": ("tensorflow", "tensorflow-cpu"),
           "optuna": ("optuna",), "ray": ("ray",), "mlflow": ("mlflow",)}


class UnsupportedVersionWarning(UserWarning):
    """An installed dependency is outside the range precision-tuner declares."""


def _declared_ranges() -> dict[str, str]:
    """Each requirement's specifier by distribution name, the extras' included (the range is
    the same in each: ``tensorflow-cpu`` under ``[cpu]``, ``tensorflow`` under ``[gpu]``)."""
    from packaging.requirements import Requirement

    ranges = {}
    for text in metadata.requires(DISTRIBUTION) or []:
        requirement = Requirement(text)
        bounds = sorted(map(str, requirement.specifier), key=lambda bound: bound[0] != ">")
        if bounds:  # the floor first: ">=3.10.0,<4"
            ranges.setdefault(requirement.name.lower(), ",".join(bounds))
    return ranges


def declared_range(name: str, source_tree: str) -> str:
    """The range the installed precision-tuner declares for ``name``; ``source_tree`` where it
    runs from a source tree without being installed (kept beside pyproject.toml's)."""
    try:
        return _declared_ranges().get(name, source_tree)
    except (ImportError, metadata.PackageNotFoundError):
        return source_tree


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def unsupported_versions() -> tuple[str, ...]:
    """One line per checked package installed outside its declared range: the package, its
    version, the range, and the pip command that fixes it. Empty where all are inside, or
    where there is nothing to check against."""
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        ranges = _declared_ranges()
    except (ImportError, metadata.PackageNotFoundError):
        return ()
    lines = []
    for names in CHECKED.values():
        for name in names:
            version, declared = _installed(name), ranges.get(name)
            if version is None or declared is None:
                continue
            try:
                inside = Version(version) in SpecifierSet(declared)
            except InvalidVersion:
                continue
            if not inside:
                lines.append(f"{name} {version} is outside precision-tuner's supported range "
                             f"{declared}; fix: pip install \"{name}{declared}\"")
    return tuple(lines)


def refuse_if_unsupported() -> None:
    """Raise ``UsageError`` with the first package outside its range (what ``tune`` and the
    commands that train get before they start anything)."""
    lines = unsupported_versions()
    if lines:
        raise UsageError(lines[0])


def warn_if_unsupported() -> None:
    """Warn, once a process, for each package outside its range (what a Python user gets when
    the apply side is imported)."""
    for line in unsupported_versions():
        warnings.warn(line, UnsupportedVersionWarning, stacklevel=3)
