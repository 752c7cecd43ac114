"""Repair a log that holds a trial twice: ``python -m harness.repair_log RUN_FOLDER``.

Each trial's first row stays; later ones move to ``trials.doubled.jsonl``, under the folder's lock.
"""

from __future__ import annotations

import sys

from harness.folder_format import LOG
from harness.tables import RunFolder, write_atomic

DOUBLED = "trials.doubled.jsonl"


def repair(folder: RunFolder) -> int:
    """Move the later rows of each trial logged twice aside (to ``DOUBLED``); returns how many moved."""
    kept: list[bytes] = []
    moved: list[bytes] = []
    seen: set[int] = set()
    with folder.lock():
        lines = folder.file(LOG).read_bytes().splitlines(keepends=True)
        rows = dict(folder.numbered_rows())
        for number, line in enumerate(lines, start=1):
            row = rows.get(number)
            if row is not None and row["index"] in seen:
                moved.append(line)
                continue
            if row is not None:
                seen.add(row["index"])
            kept.append(line)
        if moved:
            earlier = folder.file(DOUBLED).read_bytes() if folder.file(DOUBLED).is_file() else b""
            write_atomic(folder.file(DOUBLED), earlier + b"".join(moved))
            write_atomic(folder.file(LOG), b"".join(kept))
    return len(moved)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m harness.repair_log RUN_FOLDER\n")
        return 2
    try:
        moved = repair(RunFolder.open(args[0]))
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"repair_log: {exc}\n")
        return 2
    print(f"{moved} doubled row(s) moved to {DOUBLED}" if moved else "no trial is logged twice")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
