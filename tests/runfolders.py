"""What several test files ask of, and do to, the run folders a command wrote."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from harness.tables import RunFolder
from tests import ROOT

# A committed H200 run folder of each project tier: a report reads each anywhere, and a finished screen
# resumes on the CPU too (nothing is left to run).
TIER_FOLDERS = {
    "pair": ROOT / "reports/h200-decisive/baseline-d/pair-20261202-060853-6006",
    "screen": ROOT / "reports/h200-decisive/screen/screen-20261202-020126-5cf4",
    "probe": ROOT / "reports/h200-decisive/probe-lm-6GiB/probe-20261202-021557-b829",
    "parity": ROOT / "reports/h200-decisive/parity/parity-20261202-020331-f306",
    "stages": ROOT / "reports/h200-decisive/stages-baseline/stages-20261202-020854-c8f7",
}

# One H200 as `harness.env.gpu_snapshot` records it in env.json (its memory and UUID aside).
H200_GPU = {
    "index": 0,
    "name": "NVIDIA H200",
    "sm_clock_mhz": 1980.0,
    "mem_clock_mhz": 3201.0,
    "temperature_c": 34.0,
    "power_w": 118.5,
    "driver_version": "580.159.04",
}


def only_run(root: Path) -> RunFolder:
    """The one run folder under ``root`` (a fit tier's shared `datasets` folder aside)."""
    folders = [p for p in root.iterdir() if p.is_dir() and p.name != "datasets"]
    assert len(folders) == 1, folders
    return RunFolder(folders[0])


def copy_run(folder: RunFolder, where: Path) -> RunFolder:
    """A copy of ``folder`` at ``where``, for a test that writes to it."""
    shutil.copytree(folder.path, where)
    return RunFolder(where)


def copy_tier_run(name: str, where: Path) -> Path:
    """A copy of the committed run folder of tier ``name`` (`TIER_FOLDERS`) at ``where / "run"``."""
    copy = where / "run"
    shutil.copytree(TIER_FOLDERS[name], copy)
    return copy


def edit_folder(folder: Path, where: str | int, change: Callable[[dict], None]) -> None:
    """Applies ``change`` to ``folder``'s plan (``where`` is "plan") or to its log's row on line ``where``."""
    if where == "plan":
        corrupt_plan(RunFolder(folder), change)
        return
    lines = (folder / "trials.jsonl").read_text().splitlines()
    row = json.loads(lines[where - 1])
    change(row)
    lines[where - 1] = json.dumps(row)
    (folder / "trials.jsonl").write_text("\n".join(lines) + "\n")


def refused_report(bench, folder: Path, out: Path, fragments: tuple[str, ...]) -> None:
    """The report of ``folder`` is one line naming each fragment, exit 2, nothing written under ``out``."""
    error = bench.refused(["report", str(folder), "-o", str(out / "r.md")], *fragments)
    assert error.startswith("bench: error: "), error
    assert not (out / "r.md").exists() and not (out / "r-figures").exists()


def set_field(path: str, value) -> Callable[[dict], None]:
    """An edit of a plan that sets the dotted ``path`` (list indices as numbers) to ``value``."""

    def change(plan: dict) -> None:
        *parents, last = path.split(".")
        target = plan
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value

    return change


def dropped(key: str) -> Callable[[dict], None]:
    """An edit of a plan that removes its ``key``."""
    return lambda plan: plan.pop(key)


def corrupt_plan(folder: RunFolder, how) -> None:
    """Writes ``folder``'s plan.json edited by ``how``, or replaced by ``how`` where it is text or bytes."""
    if callable(how):
        plan = json.loads(folder.file("plan.json").read_text())
        how(plan)
        how = json.dumps(plan)
    path = folder.file("plan.json")
    path.write_bytes(how) if isinstance(how, bytes) else path.write_text(how)


def untouched(folder: RunFolder) -> dict[str, tuple[bytes, int]]:
    """Each file's bytes and modification time; a refused command changes neither, run.lock included."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.path.iterdir() if p.is_file()}


def tmp_files(root: Path) -> list[Path]:
    """The temporary files a write left under ``root``."""
    return sorted(p for p in root.rglob("*") if p.name.endswith(".tmp"))
