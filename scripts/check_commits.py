#!/usr/bin/env python3
"""Refuse commit subjects over 72 characters.

Usage: ``python scripts/check_commits.py BASE`` checks each commit in ``BASE..HEAD``.
Given a file instead, it checks the message in it: git's ``commit-msg`` hook passes one.
Install the hook with ``ln -s ../../scripts/check_commits.py .git/hooks/commit-msg``.
Exit 0 when every subject fits, 1 when one is too long, 2 on bad input.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIMIT = 72


def subjects(target: str) -> list[tuple[str, str]]:
    """``(where, subject)`` of the message file ``target``, else of each commit in ``target..HEAD``."""
    if Path(target).is_file():
        lines = [line for line in Path(target).read_text().splitlines() if not line.startswith("#")]
        return [(target, next((line for line in lines if line.strip()), ""))]
    log = subprocess.run(
        ["git", "log", "--format=%h %s", f"{target}..HEAD"], capture_output=True, text=True, check=False
    )
    if log.returncode:
        raise ValueError(f"{target!r} is neither a message file nor a revision git knows")
    return [tuple(line.split(" ", 1)) for line in log.stdout.splitlines()]  # type: ignore[misc]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_commits.py BASE | MESSAGE_FILE", file=sys.stderr)
        return 2
    try:
        found = subjects(argv[0])
    except ValueError as exc:
        print(f"check_commits: error: {exc}", file=sys.stderr)
        return 2
    long = [(where, subject) for where, subject in found if len(subject) > LIMIT]
    for where, subject in long:
        print(f"{where}: subject of {len(subject)} characters (at most {LIMIT}): {subject[:40]}…")
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
