"""``precision-tuner``: the argument parser and ``tune`` (``main``), the small commands
(``commands``), the service commands (``service_commands``) and the live progress bar
(``progress``). The top of the stack: it may import anything, nothing imports it.
"""

from tuner.cli.main import main

__all__ = ["main"]
