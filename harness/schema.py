"""Each option declared once: a settings field with its help, flag and bounds as metadata (``Option``).

The CLI makes a command's options from the fields; ``check_fields`` is the one check of the CLI, the API
and a resumed plan."""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.errors import InputError

OPTION = "bench_option"
SAME = object()  # the command line's default is the field's
# No count here means anything past 2**31 - 1; larger values overflow the sizes torch and numpy take.
MAX_COUNT = 2**31 - 1
LOWEST = {1: "a positive whole number", 0: "zero or more"}  # a low bound's words (a count's bounds)


@dataclass(frozen=True)
class Option:
    """How one settings field appears on the command line, and the values it accepts."""

    help: str  # the --help text; empty: a recorded setting with no option
    flag: str | tuple[str, ...] | None = None  # a boolean's one flag (no --no-… twin), or an option's names
    cli_type: Any = None  # the type the command line parses, where the field keeps another
    cli_default: Any = SAME  # the command line's default, where it differs (None: resolved later)
    low: float | None = None  # 1: a positive whole number; 0: zero or more
    high: float | None = None
    choices: tuple[str, ...] = ()  # the words a text option accepts
    words: tuple[str, ...] = ()  # words a number's option takes too (auto)
    check: Callable[[Any], Any] | None = None  # any other check: raises InputError with the one line
    parse: Callable[[str], Any] | None = None  # the typed text → the field's value (ValueError: not accepted)
    hidden: bool = False  # left out of --help (a deprecated spelling)


class OptionError(InputError):
    """A value outside its option's bounds; ``field`` names the option."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def option(default: Any, help: str = "", **how: Any) -> Any:
    """A settings field with its default and its option (see the module's table)."""
    return dataclasses.field(default=default, metadata={OPTION: Option(help, **how)})


def require(test: Callable[[Any], bool], message: str) -> Callable[[Any], None]:
    """A field's ``check``: ``InputError(message.format(value))`` unless ``test(value)``."""

    def check(value: Any) -> None:
        if not test(value):
            raise InputError(message.format(value))

    return check


def finite(test: Callable[[float], bool]) -> Callable[[float], bool]:
    """``test`` of a finite number only: NaN and the infinities fail it."""
    return lambda value: math.isfinite(value) and test(value)


def flag_of(name: str) -> str:
    """A field's command-line flag: ``max_pairs`` → ``--max-pairs``."""
    return "--" + name.replace("_", "-")


def declared(cls: type, cli: bool = True) -> list[tuple[dataclasses.Field, Option, Any]]:
    """(field, its option, its type) for every field of ``cls`` declared with ``option``, in field order;
    with ``cli``, only those on the command line."""
    hints = typing.get_type_hints(cls)
    return [
        (f, f.metadata[OPTION], hints[f.name])
        for f in dataclasses.fields(cls)
        if OPTION in f.metadata and (f.metadata[OPTION].help or not cli)
    ]


def parse_typed(cls: type, values: dict[str, Any], prefix: str = "--") -> dict[str, Any]:
    """``values`` with each declared field's typed text parsed: by its ``parse``, or as a whole number or one of
    its ``words`` (``auto``); ``InputError`` names the option."""
    out = dict(values)
    for field, how, _ in declared(cls, cli=False):
        text, flag = out.get(field.name), named(flag_of(field.name), prefix)
        if not isinstance(text, str) or not (how.parse or how.words):
            continue
        try:
            out[field.name] = how.parse(text) if how.parse else _whole_or_word(flag, text, how)
        except InputError as exc:
            raise InputError(named(str(exc), prefix)) from None
        except ValueError as exc:
            raise InputError(f"{flag} {exc}") from None
    return out


def _whole_or_word(flag: str, text: str, how: Option) -> int | str:
    word = text.strip().lower()
    if word in how.words:
        return word
    try:
        return int(word)
    except ValueError:
        lowest = "a positive whole number" if how.low == 1 else f"a whole number of {how.low:g} or more,"
        raise InputError(
            f"{flag} '{text}' is not a number; use {lowest} or {' or '.join(how.words)}"
        ) from None


def check_at_most(name: str, value: int | float, maximum: int | float) -> int | float:
    """``value`` unless it is more than ``maximum`` (the bound is argued where it is defined)."""
    if value > maximum:
        shown = f"{maximum:g}" if isinstance(maximum, float) else str(maximum)
        raise InputError(f"{name} {value} is more than {shown}, the most a run can take; use {shown} or less")
    return value


def check_choice(name: str, value: str, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        raise InputError(f"{name} '{value}' is not accepted; use one of: {', '.join(accepted)}")
    return value


def named(text: str, prefix: str) -> str:
    """``text`` with each ``--flag`` named with ``prefix``; the API's empty prefix gives the keyword."""
    if prefix == "--":
        return text
    return re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*)", lambda m: prefix + m.group(1).replace("-", "_"), text)


def _kind(value: Any, kind: Any, shown: str) -> None:
    """``InputError`` unless a number's field holds a number (whole for an ``int``), or text it takes."""
    members = typing.get_args(kind) or (kind,)
    word = "number" if float in members else "whole number" if int in members else None
    if word is None or (isinstance(value, str) and str in members):
        return
    fits = isinstance(value, int) if word == "whole number" else isinstance(value, numbers.Real)
    if isinstance(value, bool) or not fits:
        raise InputError(f"{shown} {value!r} is not a {word}")


def check_value(name: str, value: Any, how: Option, prefix: str = "--", kind: Any = None) -> None:
    """One value against its option's type, bounds, choices and check; ``OptionError`` names the field."""
    shown = named(flag_of(name), prefix)
    try:
        if value is None or value in how.words:
            return
        if not (isinstance(value, str) and how.cli_type is not None):  # text its tier parses later
            _kind(value, kind, shown)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            if how.low is not None or how.choices:
                raise InputError(f"{shown} {value!r} is not accepted")
        if how.choices:
            check_choice(shown, value, how.choices)
        if how.low is not None or how.high is not None:
            if isinstance(value, str):
                raise InputError(f"{shown} '{value}' is not a number")
            low = -math.inf if how.low is None else how.low
            if not (isinstance(value, int) or math.isfinite(value)) or value < low:
                lowest = LOWEST.get(low, f"at least {low:g}")
                raise InputError(f"{shown} must be {lowest} (got {value})")
            check_at_most(shown, value, how.high or (MAX_COUNT if low in LOWEST else math.inf))
        if how.check is not None:
            how.check(value)
    except InputError as exc:
        raise OptionError(name, named(str(exc), prefix)) from None


def check_fields(settings: Any, prefix: str = "--") -> Any:
    """``settings`` unless a declared field is outside its bounds (``OptionError`` on the first one)."""
    for field, how, kind in declared(type(settings), cli=False):
        check_value(field.name, getattr(settings, field.name), how, prefix, kind)
    return settings
