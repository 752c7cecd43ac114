"""Each tier option declared once: a field of the tier's settings dataclass, its help and flag as metadata.

The CLI makes a command's options from the fields (``parameters``) and the settings back from what was typed
(``settings_from``). An option then touches one file, its tier's settings, plus where it is used.

```python
@dataclass(frozen=True)
class ScreenSettings:
    steps: int = option(10, "Timed optimizer steps per trial (the window).")
```

| metadata | meaning |
| --- | --- |
| ``help`` | the ``--help`` text |
| ``flag`` | a boolean's one flag (``--stages``), with no ``--no-…`` twin |
| ``cli_type`` | the type the command line parses, where the field keeps another (a ``Path`` kept as text) |
| ``cli_default`` | the command line's default, where it differs from the field's (None: resolved later) |
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from typing import Annotated, Any

OPTION = "bench_option"
_SAME = object()  # the command line's default is the field's


@dataclass(frozen=True)
class Option:
    """How one settings field appears on the command line."""

    help: str
    flag: str | None = None
    cli_type: Any = None
    cli_default: Any = _SAME


def option(default: Any, help: str, **how: Any) -> Any:
    """A settings field with its default and its command-line option (see the module's table)."""
    return dataclasses.field(default=default, metadata={OPTION: Option(help, **how)})


def declared(cls: type) -> list[tuple[dataclasses.Field, Option, Any]]:
    """(field, its option, its type) for every field of ``cls`` declared with ``option``, in field order."""
    hints = typing.get_type_hints(cls)
    return [(f, f.metadata[OPTION], hints[f.name]) for f in dataclasses.fields(cls) if OPTION in f.metadata]


def parameters(cls: type) -> list[inspect.Parameter]:
    """The command's keyword parameters, one per declared field, as typer reads them."""
    import typer  # the CLI's: a worker that imports a tier's settings never needs it

    out = []
    for field, how, kind in declared(cls):
        given = typer.Option(how.flag, help=how.help) if how.flag else typer.Option(help=how.help)
        default = field.default if how.cli_default is _SAME else how.cli_default
        annotation = Annotated[how.cli_type or kind, given]
        out.append(
            inspect.Parameter(
                field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    return out


def settings_from(cls: type, values: dict[str, Any]) -> Any:
    """The settings from a command's values (a ``cli_type`` value kept as the field's text where it differs)."""
    out = {}
    for field, how, _ in declared(cls):
        value = values[field.name]
        out[field.name] = str(value) if how.cli_type is not None and value is not None else value
    return cls(**out)
