"""A package's public names imported on first use (PEP 562's module ``__getattr__``).

``tuner``, ``tuner.api`` and ``tuner.cli`` name what lives in their submodules; importing the
submodules when the package is imported cost a service job's entrypoint (tuner.cli.handoff),
which only passes through, 0.2 s of its start, and ``precision-tuner submit`` as much.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_names(namespace: dict[str, Any], where: dict[str, str]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package whose globals are ``namespace``:
    ``where`` maps each name to the module that defines it, imported when the name is first
    read (then kept in the package's globals)."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
