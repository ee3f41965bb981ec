"""``precision-tuner``: the argument parser and dispatch (``app``, whose ``main`` is the console
script), the ``tune`` command (``tune``), the small commands (``commands``), the service's job
commands (``jobs``) and its start/stop (``service_commands``), a service job's entrypoint
(``handoff``) and the spare drivers it runs in (``spare``), the option types
(``arguments``) and the live progress bar (``progress``). The top of the stack: it may import
anything, nothing imports it. ``main`` is imported on first use (tuner.lazy_names): a job's
entrypoint imports only tuner.cli.handoff.
"""

from tuner.lazy_names import lazy_names

__all__ = ["main"]
__getattr__, __dir__ = lazy_names(globals(), {"main": "tuner.cli.app"})
