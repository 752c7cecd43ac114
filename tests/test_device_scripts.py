"""The device scripts' packing (scripts/h200_pack.sh): a device call returns at most 8 files of 16 MiB, so a
call must bring back only the run folders it changed, without checkpoints, dataset caches or the trainer's
font copies, and every log in one file."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar"
)


def write(path: Path, text: str = "x", age_s: float = 0.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if age_s:
        stamp = time.time() - age_s
        os.utime(path, (stamp, stamp))


def names(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return {member.name.removeprefix("./") for member in tar.getmembers() if member.isfile()}


def test_pack_brings_back_only_changed_run_folders_and_one_log_archive(tmp_path: Path) -> None:
    home = tmp_path / "tree" / "reports" / "decisive"
    write(home / "screen" / "screen-old" / "trials.jsonl", age_s=3600)  # committed, untouched this call
    write(home / "upstream-d" / "pair-1" / "trials.jsonl", age_s=3600)  # resumed: gains a row this call
    write(home / "logs" / "2026-12-01" / "screen.log", age_s=3600)
    mark = tmp_path / "mark"
    write(mark, age_s=60)
    write(home / "upstream-d" / "pair-1" / "trials.jsonl", "x\ny")
    write(home / "upstream-d" / "pair-1" / "trials" / "000" / "fit" / "last.pt")
    write(home / "upstream-d" / "pair-1" / "ultralytics-config" / "Ultralytics" / "Arial.ttf")
    write(home / "upstream-d" / "datasets" / "synthetic" / "images" / "0.jpg")
    write(home / "parity" / "parity-new" / "report.md")
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    write(logs / "upstream-d.log")
    write(logs / "parity.log")
    environment = {**os.environ, "OUT": str(out), "LOGS": str(logs), "MARK": str(mark)}
    script = f". {REPO / 'scripts' / 'h200_pack.sh'} && pack decisive reports/decisive"
    subprocess.run(["bash", "-c", script], cwd=tmp_path / "tree", env=environment, check=True)

    assert sorted(path.name for path in out.iterdir()) == ["decisive.tgz", "logs.tgz"]
    assert names(out / "decisive.tgz") == {
        "reports/decisive/upstream-d/pair-1/trials.jsonl",
        "reports/decisive/parity/parity-new/report.md",
    }
    assert names(out / "logs.tgz") == {"upstream-d.log", "parity.log"}


def test_pack_without_changes_writes_no_run_archive(tmp_path: Path) -> None:
    home = tmp_path / "tree" / "reports" / "decisive"
    write(home / "screen" / "screen-old" / "trials.jsonl", age_s=3600)
    out = tmp_path / "out"
    out.mkdir()
    environment = {**os.environ, "OUT": str(out), "LOGS": str(tmp_path / "logs")}
    environment.pop("MARK", None)  # the mark is made when the script is sourced
    script = f". {REPO / 'scripts' / 'h200_pack.sh'} && pack decisive reports/decisive"
    subprocess.run(["bash", "-c", script], cwd=tmp_path / "tree", env=environment, check=True)
    assert sorted(path.name for path in out.iterdir()) == ["logs.tgz"]
