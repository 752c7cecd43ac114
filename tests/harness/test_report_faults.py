"""A report's outputs under faults: read-only folders, figures folders that are not one, interrupts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness import plots
from harness.cli import main
from harness.tables import RunFolder
from tests.runfolders import copy_run, tmp_files


def test_a_report_elsewhere_writes_nothing_in_a_read_only_run_folder(
    read_only_disk, tmp_path: Path, bench
) -> None:
    mount, folder = read_only_disk
    assert main(["report", str(folder.path), "-o", str(tmp_path / "elsewhere" / "report.md")]) == 0
    assert (tmp_path / "elsewhere" / "report.md").is_file()
    assert tmp_files(mount) == []
    bench.refused(["report", str(folder.path)], "read-only", "-o")
    bench.refused(["report", str(folder.path), "-o", str(mount / "x.md")], "read-only")


def test_a_report_whose_figures_folder_is_a_file_is_one_line(
    finished_run: RunFolder, tmp_path: Path, bench
) -> None:
    """A file where the report's figures folder goes (`report-figures`, `NAME-figures`) is one line, before
    anything is drawn.
    """
    folder = copy_run(finished_run, tmp_path / "run")
    (folder.path / "report.md").unlink(missing_ok=True)
    shutil.rmtree(folder.path / "report-figures", ignore_errors=True)
    (folder.path / "report-figures").write_text("a file")
    bench.refused(["report", str(folder.path)], "report-figures", "is a file")
    assert not (folder.path / "report.md").exists()
    (tmp_path / "mine-figures").write_text("a file")
    bench.refused(["report", str(folder.path), "-o", str(tmp_path / "mine.md")], "mine-figures")
    assert not (tmp_path / "mine.md").exists()


def test_a_report_where_no_folder_can_be_made_is_one_line(finished_run: RunFolder, bench) -> None:
    """`-o /proc/r.md` names a folder that takes no new entries, even for root: one line naming what could not
    be made.
    """
    bench.refused(["report", str(finished_run.path), "-o", "/proc/r.md"], "/proc/r")


def _files(folder: Path) -> dict[Path, bytes]:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_an_interrupted_report_leaves_no_figures_half_drawn(
    finished_run: RunFolder, tmp_path: Path, monkeypatch
) -> None:
    """Ctrl-C at a report's second figure leaves the old report and its figures as they were.

    The figures are drawn aside and put in place with the markdown.
    """
    folder = copy_run(finished_run, tmp_path / "run")
    assert main(["report", str(folder.path)]) == 0
    # The first figure drawn, made distinguishable from its redraw.
    (folder.path / "report-figures" / "telemetry.png").write_bytes(b"an older figure")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_timeline", interrupted)
    before = _files(folder.path)
    assert main(["report", str(folder.path)]) == 130
    assert _files(folder.path) == before
    assert main(["report", str(folder.path), "-o", str(tmp_path / "new.md")]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("where", ["the run folder itself", "a folder holding the run folder"])
def test_a_report_whose_figures_folder_holds_more_than_figures_is_refused(
    finished_run: RunFolder, tmp_path: Path, bench, where: str
) -> None:
    """``bench report a-figures -o a.md``: the figures folder's name landed on the run folder (or a folder
    holding it), which the report then replaced whole, deleting the run's log. A figures folder holding
    anything but a report's PNGs is refused in one line, and nothing is touched."""
    if where == "the run folder itself":
        folder = copy_run(finished_run, tmp_path / "a-figures")
    else:
        folder = copy_run(finished_run, tmp_path / "a-figures" / "run1")
    before = _files(tmp_path)
    bench.refused(["report", str(folder.path), "-o", str(tmp_path / "a.md")], "a-figures")
    assert _files(tmp_path) == before


def test_a_report_replaces_its_figures_folder_whole(finished_run: RunFolder, tmp_path: Path) -> None:
    """A figure the new report does not draw does not linger beside it from an older one."""
    folder = copy_run(finished_run, tmp_path / "run")
    (folder.path / "report-figures").mkdir()
    (folder.path / "report-figures" / "from-an-older-report.png").write_bytes(b"old")
    assert main(["report", str(folder.path)]) == 0
    drawn = sorted(p.name for p in (folder.path / "report-figures").iterdir())
    assert "from-an-older-report.png" not in drawn and "timeline.png" in drawn
    assert sorted(p.name for p in folder.path.iterdir() if "figures" in p.name) == ["report-figures"]


def test_a_report_elsewhere_leaves_the_run_folder_as_it_was(finished_run: RunFolder, tmp_path: Path) -> None:
    folder = copy_run(finished_run, tmp_path / "run")
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.path.rglob("*") if p.is_file()}
    assert main(["report", str(folder.path), "-o", str(tmp_path / "elsewhere.md")]) == 0
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.path.rglob("*") if p.is_file()}
    assert after == before
