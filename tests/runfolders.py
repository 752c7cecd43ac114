"""What several test files ask of the run folders a command wrote."""

from __future__ import annotations

from pathlib import Path

from harness.tables import RunFolder


def only_run(root: Path) -> RunFolder:
    """The one run folder under ``root`` (a fit tier's shared `datasets` folder aside)."""
    folders = [p for p in root.iterdir() if p.is_dir() and p.name != "datasets"]
    assert len(folders) == 1, folders
    return RunFolder(folders[0])
