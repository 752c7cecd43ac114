"""The markdown report of one or more run folders, from the folders alone (docs/run-folder.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from harness.errors import InputError
from harness.formatting import code, when
from harness.present import caveats, protocol_text, results
from harness.present.model import Section, markdown
from harness.present.run_view import LoadedRun
from harness.present.summary import summary_section, title_section
from harness.report_env import environment_section
from harness.safe_fs import remove_tree
from harness.tables import RunFolder, RunFolderWriteError, check_can_write, unnameable, write_atomic
from harness.tier import Run, TierRegistry

REPORT_NAME = "report.md"


def _tier_section(run: LoadedRun) -> Section | None:
    """The tier's own section: a ``Section``, or markdown text (``###`` headings)."""
    made = run.tier.section(run)
    if isinstance(made, Section) or not made or not str(made).strip():
        return made or None
    return Section("").add(str(made).strip())


def _run_section(run: LoadedRun) -> Section:
    parts = (
        protocol_text.protocol_section,
        results.results_section,
        results.verdict_section,
        results.diagnostics_section,
        results.stability_section,
        results.planning_section,
        results.failures_section,
        results.telemetry_section,
        caveats.caveats_section,
        results.plots_section,
        _tier_section,
    )
    if not run.tier.paired:  # a tier whose rows are not paired trials reads them in its own section
        parts = (_tier_section, results.failures_section, caveats.caveats_section)
    opening = f"Run folder {code(run.name)}; started {when(run.plan.created)}."
    return Section(run.title, [opening], depth=2).add(*(part(run) for part in parts))


def resolve_output(folders: Sequence[RunFolder], output: Path | None) -> Path:
    """Where the report goes; ``InputError`` (one line) for what cannot be right."""
    if not folders:
        raise InputError("no run folder given; use: bench report RUN_DIR [RUN_DIR …] [-o reports/NAME.md]")
    seen: set[Path] = set()
    for folder in folders:
        key = folder.path.resolve()
        if key in seen:
            raise InputError(f"run folder '{folder.path}' is given twice; name each run folder once")
        seen.add(key)
    if output is None:
        if len(folders) > 1:
            raise InputError(
                f"{len(folders)} run folders make one combined report: name it with -o, e.g. -o reports/NAME.md"
            )
        return folders[0].path / REPORT_NAME
    why, path = unnameable(output), Path(output)
    problem = (
        f": {why}"
        if why
        else " is not a markdown file"
        if path.suffix.lower() != ".md"
        else " is a directory"
        if path.is_dir()
        else ""
    )
    if problem:
        raise InputError(f"-o '{output}'{problem}; give a file path ending in .md, e.g. reports/NAME.md")
    return path


def _load(folders: Sequence[RunFolder], output: Path, tiers: TierRegistry, drawn_in: Path) -> list[LoadedRun]:
    """The runs, each to draw its figures under ``drawn_in`` in ``<stem>-figures`` (``-<k>`` each of several)."""
    several = len(folders) > 1
    runs = []
    for number, folder in enumerate(folders, start=1):
        run = Run.load(folder, drawn_in / (f"{output.stem}-figures" + f"-{number}" * several), tiers)
        runs.append(LoadedRun(**vars(run), number=number, several=several, tiers=tiers))
    return runs


def _staging(report: Path, pid: int | str = "*") -> Path:
    """Where a report process draws its figures first: ``<stem>-figures.<pid>.partial`` (a glob for any pid)."""
    return report.parent / f"{report.stem}-figures.{pid}.partial"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _remove_stale_staging(report: Path) -> None:
    """Remove the staging folders of reports of ``report`` whose process is gone (and this process's own)."""
    for folder in report.parent.glob(_staging(report).name):
        pid = folder.name[len(f"{report.stem}-figures.") : -len(".partial")]
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            remove_tree(folder)


def render(runs: list[LoadedRun]) -> str:
    """The markdown of the report (and, as it goes, its PNGs in each run's figures folder, made already)."""
    head = [title_section(runs), summary_section(runs), environment_section(runs)]
    return "\n".join(markdown(Section("", [*head, *map(_run_section, runs)]))).rstrip() + "\n"


def write_report(
    folders: list[RunFolder], tiers: TierRegistry | None = None, output: Path | None = None
) -> Path:
    """Write the report of ``folders`` (one, or several side by side) and return the markdown's path."""
    folders = [RunFolder.open(f.path) for f in folders]
    path = resolve_output(folders, output)
    if output is None:
        check_can_write(path.parent, "run folder", "write the report elsewhere with -o NAME.md")
    else:
        check_can_write(path.parent, "-o")
    staging = _staging(path, os.getpid())  # this report's own: two reports of one folder never share it
    runs = _load(folders, path, tiers or TierRegistry(), staging)
    for run in runs:  # a file where the figures go is refused before anything is drawn
        final = path.parent / run.figures_dir.name
        check_can_write(final, "the report's figures folder", "move it, or name the report otherwise with -o")
        _check_only_figures(final)
    _remove_stale_staging(path)  # left by a report killed outright
    try:
        for folder in [path.parent, *(run.figures_dir for run in runs)]:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a folder that takes no new entries (/proc), found only by trying
                raise RunFolderWriteError(f"could not make {folder}: {exc.strerror or exc}") from None
        try:
            text = render(runs)
        except OSError as exc:  # a figure that could not be drawn (a full disk): nothing replaced yet
            raise RunFolderWriteError(
                f"could not draw the report's figures beside {path}: {exc.strerror or exc}; nothing was replaced"
            ) from None
        for run in runs:
            _put_in_place(run.figures_dir, path.parent / run.figures_dir.name, staging)
        return write_atomic(path, text)
    finally:
        remove_tree(staging)


def _check_only_figures(folder: Path) -> None:
    """A figures folder the report will replace whole holds nothing but a report's PNGs."""
    if not folder.is_dir():
        return
    other = next((p for p in folder.iterdir() if not (p.is_file() and p.suffix == ".png")), None)
    if other is not None:
        raise InputError(
            f"the report's figures folder '{folder}' holds '{other.name}', not only a report's figures, and a "
            "report replaces that folder whole; move it, or name the report otherwise with -o"
        )


def _put_in_place(drawn: Path, final: Path, staging: Path) -> None:
    """``drawn`` renamed to ``final``; an older ``final`` is moved into ``staging`` first (removed with it)."""
    try:
        if final.exists():
            final.rename(staging / f"{final.name}.older")
        drawn.rename(final)
    except OSError as exc:
        raise RunFolderWriteError(f"could not put the figures in {final}: {exc.strerror or exc}") from None
