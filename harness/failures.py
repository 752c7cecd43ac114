"""Arms whose every measured trial failed: one console line per distinct error, and exit status 3.

A run with nothing to compare must not look like a success.
"""

from __future__ import annotations

from typing import Any

EVERY_TRIAL_FAILED = 3  # bench's exit status when an arm has no ok measured trial (0 ok, 1 gate, 2 input)
SHOWN = 5  # distinct errors named per arm; the report lists every trial's


def failed_arms(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Arm label → its distinct error messages (first seen first), for arms whose every measured trial failed."""
    measured: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("phase") == "measured":
            measured.setdefault(str(row.get("arm")), []).append(row)
    out = {}
    for arm, ours in measured.items():
        if ours and all(row.get("status") != "ok" for row in ours):
            messages = [" ".join(str(row.get("message") or row.get("status")).split()) for row in ours]
            out[arm] = list(dict.fromkeys(messages))
    return out


def failure_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per arm whose every trial failed, then one per distinct error (at most ``SHOWN`` each)."""
    lines = []
    for arm, messages in failed_arms(rows).items():
        lines.append(f"every trial of arm '{arm}' failed ({len(messages)} distinct error(s)):")
        lines += [f"  {message[:300]}" for message in messages[:SHOWN]]
        if len(messages) > SHOWN:
            lines.append(f"  and {len(messages) - SHOWN} more: see the report")
    return lines
