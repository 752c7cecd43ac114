"""Where a report draws its figures first: ``<stem>-figures.<pid>.partial``, one folder per process."""

from __future__ import annotations

import os
from pathlib import Path

from harness.safe_fs import remove_tree


def staging_folder(report: Path) -> Path:
    """This process's staging folder for the report at ``report``."""
    return report.parent / f"{report.stem}-figures.{os.getpid()}.partial"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def remove_stale_staging(report: Path) -> None:
    """Remove the staging folders of reports of ``report`` whose process is gone (and this process's own)."""
    for folder in report.parent.glob(f"{report.stem}-figures.*.partial"):
        pid = folder.name[len(f"{report.stem}-figures.") : -len(".partial")]
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            remove_tree(folder)
