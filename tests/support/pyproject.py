"""``tomllib`` for the tests that read pyproject.toml: the standard library's from Python 3.11,
its backport ``tomli`` on 3.10 (the lowest Python the project admits; a dev dependency there)."""

try:
    import tomllib
except ModuleNotFoundError:
    import tomli as tomllib  # type: ignore[no-redef]  # the same module, before 3.11

__all__ = ["tomllib"]
