"""Markdown pieces every report section uses: plain values, inline code, tables, images and times."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.formatting import is_missing, without_controls

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


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A markdown table; ``align`` holds one of 'l', 'r', 'c' per column (left by default)."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    rule = [marks.get(align[i] if i < len(align) else "l", "---") for i in range(len(columns))]
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_image(path: Path, caption: str) -> str:
    """An image in a figures folder beside the markdown, referenced relative to the markdown's folder."""
    target = f"{Path(path).parent.name}/{Path(path).name}"
    if any(ch in target for ch in " ()<>"):
        target = f"<{target}>"
    return f"![{caption}]({target})"


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
