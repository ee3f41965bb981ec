"""``precision-tuner``, the top of the stack: the parser and dispatch (``app``, whose ``main`` is
the console script; its ``tune`` parser, ``tune_parser``, is built from ``TuneOptions``), the small
commands (``commands``: export, ui, diagnose, spaces, train), the service's job commands
(``jobs``) and its start/stop (``service_commands``), a service job's entrypoint (``handoff``)
and the spare drivers it runs in (``spare``), and the CLI reference page written from the
parser (``reference``). It may import anything; nothing in ``tuner`` imports it. ``main`` is
imported on first use (tuner.lazy_names): a job's entrypoint imports only tuner.cli.handoff.
"""

from tuner.lazy_names import lazy_names

__all__ = ["main"]
__getattr__, __dir__ = lazy_names(globals(), {"main": "tuner.cli.app"})
