"""The CLI reference page, written from the argparse parser itself (``build_parser``): every
command, subcommand and flag with its choices, default and help, so that the documentation
site's page can never drift from what ``precision-tuner`` accepts. The site's build hook
(``docs/hooks.py``) puts it on ``reference/cli.md``; tests/project/test_docs.py checks it there.
"""

from __future__ import annotations

import argparse


def cli_reference(parser: argparse.ArgumentParser) -> str:
    """Markdown for ``parser`` and, depth first, each of its subcommands."""
    return "\n".join(_command(parser, parser.prog, level=2)) + "\n"


def _command(parser: argparse.ArgumentParser, name: str, level: int,
             summary: str | None = None) -> list[str]:
    lines = [f"{'#' * level} `{name}`", ""]
    if parser.description or summary:
        lines += [(parser.description or summary).strip(), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = [_row(action, name) for action in parser._actions
            if action.help != argparse.SUPPRESS
            and not isinstance(action, (argparse._SubParsersAction, argparse._HelpAction))]
    if rows:
        lines += ["| argument | values | default | what |", "|---|---|---|---|", *rows, ""]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for sub, subparser in action.choices.items():
                if helps.get(sub) == argparse.SUPPRESS:
                    continue
                lines += _command(subparser, f"{name} {sub}", min(level + 1, 4), helps.get(sub))
    return lines


def _row(action: argparse.Action, prog: str) -> str:
    flags = ", ".join(f"`{flag}`" for flag in action.option_strings) or \
        f"`{action.metavar or action.dest}`"
    if action.choices is not None:
        values = " \\| ".join(f"`{choice}`" for choice in action.choices)
    elif action.nargs == 0:
        values = "(a switch)"
    else:
        values = f"`{action.metavar or action.dest.upper()}`"
    default = "" if action.default in (None, False, argparse.SUPPRESS) or action.required \
        or not action.option_strings else f"`{action.default}`"
    text = (action.help or "").strip()
    if "%" in text:
        text = text % {**vars(action), "prog": prog, "default": action.default}
    text = " ".join(text.split()).replace("|", "\\|")
    if action.required and action.option_strings:
        text = f"required. {text}"
    return f"| {flags} | {values} | {default} | {text} |"
