"""Every error precision-tuner raises on purpose.

Hierarchy::

    TunerError                     base; carries a one-line, user-facing message
    ├── UsageError                 bad input from the user: exit code 2
    │   ├── ConfigError            a PrecisionConfig (file or dict) is invalid
    │   ├── SearchSpaceError       a search-space YAML is invalid
    │   └── TaskError              a task file breaks the task-file contract
    └── TrialInfrastructureError   the machinery around a trial failed (not the trial itself)

A message says what is wrong, shows the bad value, and says how to fix it, on one line.
Failures *inside* a trial (NaN losses, dtype mismatches, out of memory) are never raised to
the driver: they are recorded in the trial result (see :mod:`tuner.trial_types`).
"""

from __future__ import annotations


class TunerError(Exception):
    """Base class of all errors raised on purpose by precision-tuner."""

    exit_code = 1


class UsageError(TunerError):
    """The user gave something we cannot work with; nothing has been written."""

    exit_code = 2


class ConfigError(UsageError):
    """A precision config is invalid (unknown key, bad value, newer schema)."""


class SearchSpaceError(UsageError):
    """A search space is invalid (YAML syntax, unknown key, bad value)."""


class TaskError(UsageError):
    """A task file does not satisfy the task-file contract."""


class TrialInfrastructureError(TunerError):
    """The worker process machinery failed in a way that is not a trial's own failure."""


class GuardError(TunerError):
    """The precision guard ran out of repairs under a policy with no last resort (pure 16-bit);
    its message says what it saw and tried."""


class ServiceOutage(TunerError):
    """The service's job server did not answer (a timeout, a refused token, a dropped
    connection): not an answer about a job, so nothing may be concluded from it."""


def describe(value: object) -> str:
    """Render a received value for an error message: ``'abc' (of type str)``."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (of type {type(value).__name__})"


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's first non-empty message line (its type name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def error_line(exc: BaseException) -> str:
    """``Type: first line`` of what a worker raised. A Ray task error's own text begins with
    the actor's repr (``ray::TrialActor.check_task() (pid=...)``), so its ``cause`` is read."""
    cause = getattr(exc, "cause", None)
    exc = cause if isinstance(cause, BaseException) else exc
    return f"{type(exc).__name__}: {first_line(exc)}"
