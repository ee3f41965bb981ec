"""The tune options, read off ``tuner.tune``'s signature: each keyword after the task's objects
is one option, its type and default the signature's, its help and check an ``Option`` in its
annotation (``Annotated[int | None, Option(...)]``). ``add_tune_parser`` builds
``precision-tuner tune`` from them (``submit`` reuses the parser's actions), ``checked`` holds a
Python caller's values to the same checks; so names, defaults, checks, help and one-line errors
have one definition, the signature.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from tuner.apply.vocabulary import Vocabulary
from tuner.errors import UsageError
from tuner.run.options import Flags

TRY, JUDGE, GOES, RUNS = ("what to try", "how the pick is made and checked", "where things go",
                          "where trials run")
TASK_HELP = "task file: defines build_model(), train_data() and LOSS (docs/how-to/task-files.md)"


@dataclass(frozen=True)
class Option:
    """A tune option's help (argparse's ``%(default)s`` allowed), its --help section, the check
    its value passes (an argparse type: text in, value out or ``ArgumentTypeError``; by default
    the annotation's type), its metavar, whether ``submit`` forwards it to a service's job (the
    run directory, tracking, Ray address and output are the service's business), and, where
    the command line's default differs from a Python caller's, the command line's (and how
    ``help(tuner.tune)`` names the Python caller's)."""

    help: str
    group: str
    check: Callable[[str], Any] | None = None
    metavar: str | None = None
    forwarded: bool = True
    cli_default: Any = None
    python_default: str = ""

    def __repr__(self) -> str:  # help(tuner.tune) shows the signature; the text is below it
        return "Option()"


@dataclass(frozen=True)
class TuneOption:
    """One option as the signature states it."""

    name: str
    option: Option
    default: Any
    kind: Any            # the annotation without Optional: bool, int, Path, an Enum, a Literal

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def switch(self) -> bool:
        return self.kind is bool

    @property
    def choices(self) -> tuple | None:
        if isinstance(self.kind, type) and issubclass(self.kind, Vocabulary):
            return tuple(self.kind)
        if typing.get_origin(self.kind) is typing.Literal:
            return typing.get_args(self.kind)
        return None

    @property
    def parse(self) -> Callable[[str], Any] | None:
        """argparse's ``type``: text in, the value out (None: the text itself)."""
        if self.option.check is not None:
            return self.option.check
        if isinstance(self.kind, type) and issubclass(self.kind, Vocabulary):
            return self._member
        return self.kind if self.kind in (int, float, Path) else None

    def _member(self, text: str) -> Vocabulary:
        try:
            return self.kind.named(text)   # the vocabulary's own one-line refusal
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


@functools.cache
def tune_options(tune: Callable) -> tuple[TuneOption, ...]:
    """The options of ``tune`` (``tuner.tune``), in the signature's order; read once (the
    docstring, the parser and ``submit``'s forwarded list all ask)."""
    hints = typing.get_type_hints(tune, include_extras=True)
    options = []
    for name, parameter in inspect.signature(tune).parameters.items():
        hint = hints.get(name)
        if typing.get_origin(hint) is not typing.Annotated:
            continue
        kind, option = typing.get_args(hint)[:2]
        options.append(TuneOption(name, option, parameter.default, _without_none(kind)))
    return tuple(options)


def _without_none(kind: Any) -> Any:
    """``int`` of ``int | None``; of ``str | Path | None`` the first, ``str``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return next(arg for arg in typing.get_args(kind) if arg is not type(None))
    return kind


def add_tune_parser(commands, tune: Callable) -> argparse.ArgumentParser:
    """``precision-tuner tune``: the task file, then every option of ``tune`` by section."""
    parser = commands.add_parser("tune", help="tune a task file (the main job)",
                                 description="Run trial trainings of TASK.py and write the "
                                             "fastest stable precision config.")
    groups = {name: parser.add_argument_group(name) for name in (TRY, JUDGE, GOES, RUNS)}
    groups[TRY].add_argument("task", metavar="TASK.py", help=TASK_HELP)
    for option in tune_options(tune):
        group = groups[option.option.group]
        default = option.default if option.option.cli_default is None \
            else option.option.cli_default
        if option.switch:
            group.add_argument(option.flag, action="store_true", help=option.option.help)
            continue
        group.add_argument(option.flag, type=option.parse, choices=option.choices,
                           default=default, metavar=option.option.metavar,
                           help=option.option.help)
    return parser


def checked(tune: Callable, values: dict[str, Any]) -> dict[str, Any]:
    """A Python caller's option values after the command line's checks (an int is checked as
    its text would be), refused with the line ``precision-tuner tune`` prints."""
    out = {}
    for option in tune_options(tune):
        value = values[option.name]
        if value is None:
            out[option.name] = value
            continue
        if option.switch:
            if not isinstance(value, bool):
                _refuse(option, f"must be True or False. Received: {option.name}={value!r}")
            out[option.name] = value
            continue
        try:
            value = option.parse(str(value)) if option.parse else str(value)
        except argparse.ArgumentTypeError as exc:
            _refuse(option, str(exc))
        except ValueError:
            _refuse(option, f"invalid {option.parse.__name__} value: {str(value)!r}")
        if option.choices is not None and value not in option.choices:
            _refuse(option, _invalid_choice(value, option.choices))
        out[option.name] = value
    return out


def _invalid_choice(value: Any, choices: tuple) -> str:
    return (f"invalid choice: {str(value)!r} (choose from "
            f"{', '.join(repr(str(choice)) for choice in choices)})")


def _refuse(option: TuneOption, message: str) -> typing.NoReturn:
    raise UsageError(f"argument {option.flag}: {message}. See help(tuner.tune) or "
                     "`precision-tuner tune --help`")


def options_help(tune: Callable) -> str:
    """The options as ``help(tuner.tune)`` lists them: name, default, help."""
    lines = []
    for option in tune_options(tune):
        default = option.option.python_default or str(option.default)
        text = option.option.help.replace("%%", "%").replace("%(default)s", default)
        lines += textwrap.wrap(f"{option.name} ({option.flag}): {text}", width=92,
                               initial_indent="    ", subsequent_indent="        ")
    return "\n".join(lines)


def default_run_dir(task_stem: str) -> Path:
    """runs/TASK-TIMESTAMP: where a run goes when no run directory is given."""
    return Path("runs") / f"{task_stem}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def flags_from(args, task_path: Path) -> Flags:
    """The ``Flags`` of parsed tune options (``add_tune_parser``'s; ``submit`` has the same):
    every option ``Flags`` has a field for, by its name."""
    given = vars(args)
    return Flags(task_path=task_path, **{field.name: given[field.name] for field in fields(Flags)
                                         if field.name != "task_path" and field.name in given})
