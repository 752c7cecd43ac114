"""Checks of ``bench``'s arguments that need no tier: an option given twice, ``bench plan``'s goal."""

from __future__ import annotations

import math
from typing import Any

from harness.errors import InputError
from harness.protocol_options import ProtocolOptions


def parse_percent(name: str, text: str | None) -> float | None:
    """``3%`` or ``3`` → 0.03; ``InputError`` for anything else."""
    if text is None:
        return None
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise InputError(f"{name} '{text}' is not a percentage; use e.g. 3% or 3") from None
    if not -100 < value < 100:
        raise InputError(f"{name} {text} must lie between -100% and 100%")
    return value / 100


def check_plan_goal(
    protocol: ProtocolOptions,
    effect: str | None,
    effect_value: float | None,
    tolerance: str | None,
    tolerance_value: float | None,
    bar_value: float | None,
) -> None:
    """``InputError`` unless ``bench plan``'s goal fits the run: a tolerance needs an A/A arm.

    An effect at its bar is refused too: no number of pairs resolves it."""
    if tolerance_value is not None and not protocol.control:
        raise InputError(
            f"--tolerance {tolerance} plans an A/A arm, and the run has none (it ran without --control); drop "
            "--tolerance"
        )
    if effect_value is None:
        return
    against = bar_value if bar_value is not None else 0.0  # an effect is planned against 0 unless asked
    if math.isclose(effect_value, against, abs_tol=1e-12):
        raise InputError(
            f"--effect {effect} is at the bar ({100 * against:.1f}%): no number of pairs resolves an effect at "
            "its bar; give an effect away from it, or another --bar"
        )


def check_given_once(args: list[str], commands: dict[str, Any]) -> None:
    """``InputError`` for an option given twice in a command line.

    Click would take the last silently: `--steps 4 … --steps 8` would run 8 steps."""
    if not args or args[0] not in commands or "--help" in args:
        return
    options = {
        name: param
        for param in commands[args[0]].params
        if param.param_type_name == "option"
        for name in (*param.opts, *param.secondary_opts)
    }
    given: dict[str, list[str]] = {}
    tokens = iter(args[1:])
    for token in tokens:
        if token == "--":
            break
        name, equals, value = token.partition("=") if token.startswith("--") else (token, "", "")
        param = options.get(name)
        if param is None:
            continue
        if not param.is_flag and not equals:
            value = next(tokens, "")  # the option's value, whatever it looks like
        given.setdefault(param.name, []).append(value)
        if len(given[param.name]) == 2:
            first, then = given[param.name]
            values = "" if param.is_flag else f" ({first}, then {then})"
            raise InputError(f"{'/'.join(param.opts)} given twice{values}; give it once")
