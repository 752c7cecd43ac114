"""One way to write every figure and value the harness shows, in the console and in reports alike."""

from __future__ import annotations

import datetime as _dt
import math
import re
import sys
from typing import Any


def is_missing(value: Any) -> bool:
    """None, NaN, or pandas' NA and NaT (pandas is asked only where it is loaded: a value from a table)."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    pandas = sys.modules.get("pandas")
    if pandas is None:
        return False
    try:
        return bool(pandas.isna(value))
    except (TypeError, ValueError):
        return False


def _special(value: Any, infinite: str) -> str | None:
    """'n/a' for a missing value, ``infinite`` or '-∞' for an infinite one; None for a finite one."""
    if is_missing(value):
        return "n/a"
    if math.isinf(float(value)):
        return infinite if float(value) > 0 else "-∞"
    return None


def format_number(value: Any) -> str:
    """A figure without unit: 3 decimals from 1 up, 4 significant digits below; 'failed' for +∞."""
    special = _special(value, "failed")
    if special:
        return special
    value = float(value)
    if value == 0 or abs(value) >= 1:
        return f"{value:.3f}"
    decimals = min(12, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def format_value(value: Any, unit: str) -> str:
    """A figure with its unit: ``89.448 s``."""
    text = format_number(value)
    return text if text in ("n/a", "failed", "-∞") or not unit else f"{text} {unit}"


def format_limit(bar_percent: float, control: bool) -> str:
    """What a verdict is judged against: ``the 8% bar``, or for an A/A control ``the ±1% tolerance``."""
    return f"the ±{bar_percent:g}% tolerance" if control else f"the {bar_percent:g}% bar"


def claim_limit(claim: Any) -> str:
    """A claim row's bar, or an A/A arm's tolerance, in words; 'no bar' where none was set."""
    if is_missing(claim.get("bar")):
        return "no bar"
    return format_limit(100 * float(claim["bar"]), claim.get("kind") == "control")


def format_range(low: Any, high: Any) -> str:
    """``88.765–89.646``."""
    return f"{format_number(low)}–{format_number(high)}"


def _percent_number(value: Any) -> str:
    return _special(value, "+∞") or f"{100 * float(value):.2f}"


def format_percent(value: Any) -> str:
    """A fraction as percent: ``11.19%``."""
    text = _percent_number(value)
    return text if text in ("n/a", "+∞", "-∞") else f"{text}%"


def format_probability(value: float) -> str:
    """A probability in percent, with its first decimal where it has one: ``80%``, ``99.5%``."""
    return f"{100 * value:.1f}".removesuffix(".0") + "%"


def format_percent_range(low: Any, high: Any) -> str:
    """``10.88–13.22%``."""
    return f"{_percent_number(low)}–{_percent_number(high)}%"


UNBOUNDED_RATIO = 1000.0  # an end past this time ratio (either way) is an interval's width, not a figure
UNBOUNDED = "unbounded"
UNBOUNDED_REASON = f"an end past a {UNBOUNDED_RATIO:g}× time ratio: too few pairs or too much noise"


def is_bounded(low: Any, high: Any) -> bool:
    """Whether a reduction interval can be stated: both ends finite, each within ``UNBOUNDED_RATIO`` either way."""
    if is_missing(low) or is_missing(high):
        return False
    low, high = float(low), float(high)
    return (
        math.isfinite(low)
        and math.isfinite(high)
        and 1 - low < UNBOUNDED_RATIO
        and 1 - high > 1 / UNBOUNDED_RATIO
    )


def format_interval(low: Any, high: Any) -> str:
    """A confidence interval: ``[10.88%, 13.22%]``; ``UNBOUNDED`` where it cannot be stated (``is_bounded``)."""
    if not (is_missing(low) or is_missing(high)) and not is_bounded(low, high):
        return UNBOUNDED
    return f"[{format_percent(low)}, {format_percent(high)}]"


def format_bytes(value: Any) -> str:
    """Bytes in binary units (KiB below 1 MiB, MiB below 1 GiB, else GiB); 'n/a' where missing."""
    if is_missing(value):
        return "n/a"
    value = float(value)
    if abs(value) < 2**20:
        return f"{value / 2**10:.1f} KiB"
    if abs(value) < 2**30:
        return f"{value / 2**20:.1f} MiB"
    return f"{value / 2**30:.2f} GiB"


def method_label(claim: Any) -> str:
    """A claim's interval method in a few words, from its ``ci_method``."""
    method = str(claim.get("ci_method", ""))
    if method.startswith("order statistics"):
        return "stopping-rule order-statistic" if " look " in method else "order-statistic"
    if method.startswith("calibrated"):
        return "calibrated t"
    return method.split(",")[0] or "n/a"


def format_levels(claim: Any) -> str:
    """The stated and the attained level of a claim's interval."""
    stated, attained = claim.get("ci_level"), claim.get("ci_attained")
    text = "n/a" if is_missing(stated) else f"{100 * float(stated):.0f}% stated"
    if not is_missing(attained):
        text += f", {100 * float(attained):.1f}% attained"
    return text


TERMINAL_ESCAPE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|.)?")


def without_controls(text: Any) -> str:
    """``text`` with terminal escapes removed and other control characters shown as ``\\xNN``."""
    plain = TERMINAL_ESCAPE.sub("", str(text))
    return "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" for c in plain)


NOT_RECORDED = "not recorded"


def plain(value: Any) -> str:
    """A recorded value as text, or 'not recorded'."""
    return NOT_RECORDED if is_missing(value) or value == "" else str(value)


def cell(text: Any) -> str:
    """A markdown table cell: one line, pipes escaped."""
    return " ".join(without_controls(text).split()).replace("|", "\\|")


def code(text: Any) -> str:
    """Inline code that survives backticks in the text."""
    return "`" + " ".join(without_controls(text).split()).replace("`", "'") + "`"


def when(iso: Any) -> str:
    """``2026-11-29T21:11:28+00:00`` → ``2026-11-29 21:11:28 UTC``."""
    if is_missing(iso) or not iso:
        return NOT_RECORDED
    try:
        moment = _dt.datetime.fromisoformat(str(iso))
    except ValueError:
        return str(iso)
    if moment.tzinfo is not None:
        moment = moment.astimezone(_dt.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S") + (" UTC" if moment.tzinfo is not None else "")
