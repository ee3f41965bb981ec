"""``precision-tuner``: the argument parser and dispatch (``app``, whose ``main`` is the console
script), the ``tune`` command (``tune``), the small commands (``commands``), the service's job
commands (``jobs``) and its start/stop (``service_commands``), a service job's entrypoint
(``handoff``) and the spare drivers it runs in (``spare``), the option types
(``arguments``) and the live progress bar (``progress``). The top of the stack: it may import
anything, nothing imports it.
"""

from tuner.cli.app import main

__all__ = ["main"]
