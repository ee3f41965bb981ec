"""The checks of precision-tuner's option values: each refuses a bad value in one line (what, the
bad value, the fix), as argparse prints it.

A ``Check`` holds a number to one rule: ``Check.value`` checks a value (a Python caller's, or the
text's once parsed); called with the command line's text, it is argparse's ``type``, which
parses the text first. ``OptionField`` is one field of ``tuner.run.options.TuneOptions`` as its
annotation declares it (its flag, choices, parser and check), ``option_fields`` lists them in
order: what ``precision-tuner tune``'s parser, ``help(tuner.tune)``, ``submit`` and the
options' own constructor read.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import numbers
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tuner.apply.vocabulary import Vocabulary
from tuner.errors import UsageError


@dataclass(frozen=True)
class Check:
    """A rule on a whole number (``kind`` int) or a number (``kind`` float): ``rule`` says why a
    value breaks it (None where it holds), ``expected`` what is asked for where a text or a
    value is no such number, and ``words`` the texts taken as they are (``auto``)."""

    kind: type
    expected: str
    rule: Callable[[Any], str | None]
    words: tuple[str, ...] = ()

    def __call__(self, text: str) -> Any:
        """argparse's ``type``: the command line's text, parsed, then checked."""
        if text.strip().lower() in self.words:
            return text.strip().lower()
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.expected}, got {text!r}") from None
        return self.value(value)

    def value(self, value: Any) -> Any:
        """``value`` if it keeps the rule (an int where a float is asked for becomes one);
        otherwise ``ArgumentTypeError`` with the line to print."""
        if isinstance(value, str) and value.strip().lower() in self.words:
            return value.strip().lower()
        number = numbers.Integral if self.kind is int else numbers.Real
        if isinstance(value, bool) or not isinstance(value, number):
            raise argparse.ArgumentTypeError(f"expected {self.expected}, got {value!r}")
        value = self.kind(value)
        refusal = self.rule(value)
        if refusal is not None:
            raise argparse.ArgumentTypeError(refusal)
        return value


def _at_least_one(value: int) -> str | None:
    return None if value >= 1 else f"must be at least 1, got {value}"


def _not_negative(value: int) -> str | None:
    return None if value >= 0 else f"must be 0 or more, got {value}"


def _a_share(value: float) -> str | None:
    return None if 0 < value <= 1 else ("must be in (0, 1] (a share of float32's loss decrease, "
                                        f"such as 0.9), got {value:g}")


def _an_hour_at_most(value: float) -> str | None:
    return None if 0 < value <= 3600 else f"must be in (0, 3600] seconds, got {value:g}"


def _below_one(value: float) -> str | None:
    return None if 0 <= value < 1 else f"must be in [0, 1), got {value}"


def _some_memory(value: float) -> str | None:
    return None if 0 < value <= 2**20 else f"must be a number of GiB above 0, got {value:g}"


positive_int = Check(int, "a positive integer", _at_least_one)
workers_count = Check(int, "a positive integer", _at_least_one, words=("auto",))   # --workers
count = Check(int, "a whole number such as 2", _not_negative)
ratio = Check(float, "a number such as 0.9", _a_share)
seconds = Check(float, "a number of seconds such as 5", _an_hour_at_most)
gain = Check(float, "a fraction such as 0.03", _below_one)
gibibytes = Check(float, "a number of GiB such as 16", _some_memory)


@dataclass(frozen=True)
class OptionField:
    """One option as ``TuneOptions`` declares it: its ``Option`` (help, section, check, ...),
    its default (None where the field has none: the builder gives it), and its type without
    None (bool, int, Path, an Enum, a Literal); ``optional``: None is a value it takes."""

    name: str
    option: Any          # tuner.run.options.Option
    default: Any
    kind: Any
    optional: bool

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def switch(self) -> bool:
        return self.kind is bool

    @property
    def named(self) -> bool:
        """Whether its values are a vocabulary's members (``Objective``), taken by name."""
        return isinstance(self.kind, type) and issubclass(self.kind, Vocabulary)

    @property
    def choices(self) -> tuple | None:
        if self.named:
            return tuple(self.kind)
        if typing.get_origin(self.kind) is typing.Literal:
            return typing.get_args(self.kind)
        return None

    @property
    def parse(self) -> Callable[[str], Any] | None:
        """argparse's ``type``: text in, the value out (None: the text itself)."""
        if self.option.check is not None:
            return self.option.check
        if self.named:
            return self._member
        return self.kind if self.kind in (int, float, Path) else None

    def _member(self, value: Any) -> Vocabulary:
        try:
            return self.kind.named(value)   # the vocabulary's own one-line refusal
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    def checked(self, value: Any) -> Any:
        """``value`` held to the check the command line's text is held to, in its type (a name
        becomes its ``Objective``, a str a ``Path``); refused with the line ``precision-tuner
        tune`` prints."""
        if value is None and self.optional:
            return None
        try:
            return self._value(value)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"argument {self.flag}: {exc}. See help(tuner.tune) or "
                             "`precision-tuner tune --help`") from None

    def _value(self, value: Any) -> Any:
        if self.switch:
            if isinstance(value, bool):
                return value
            raise argparse.ArgumentTypeError(f"must be True or False. Received: "
                                             f"{self.name}={value!r}")
        if self.option.check is not None:
            return self.option.check.value(value)
        if self.named:
            return self._member(value)
        if self.choices is not None:
            if value in self.choices:
                return value
            raise argparse.ArgumentTypeError(
                f"invalid choice: {str(value)!r} (choose from "
                f"{', '.join(repr(str(choice)) for choice in self.choices)})")
        if self.kind in (str, Path) and isinstance(value, (str, os.PathLike)):
            return self.kind(os.fspath(value))
        if self.kind is int and isinstance(value, numbers.Integral) \
                and not isinstance(value, bool):
            return int(value)
        raise argparse.ArgumentTypeError(f"invalid {self.kind.__name__} value: {value!r}")


@functools.cache
def option_fields(options: type) -> tuple[OptionField, ...]:
    """The options of ``options`` (``TuneOptions``), in its order: the fields whose annotation
    carries an ``Option`` (the task, positional, carries none). Read once."""
    hints = typing.get_type_hints(options, include_extras=True)
    found = []
    for field in dataclasses.fields(options):
        hint = hints[field.name]
        if typing.get_origin(hint) is not typing.Annotated:
            continue
        kind, option = typing.get_args(hint)[:2]
        default = None if field.default is dataclasses.MISSING else field.default
        found.append(OptionField(field.name, option, default, _without_none(kind),
                                 _admits_none(kind)))
    return tuple(found)


def _admits_none(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType) \
        and type(None) in typing.get_args(kind)


def _without_none(kind: Any) -> Any:
    """``int`` of ``int | None``; of ``int | Literal["auto"]`` the first, ``int``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return next(arg for arg in typing.get_args(kind) if arg is not type(None))
    return kind
