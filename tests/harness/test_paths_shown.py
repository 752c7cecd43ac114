"""Paths on the console are relative to the working folder when inside it, as the README shows them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from harness.cli import main

pytestmark = pytest.mark.skipif(shutil.which("sleep") is None, reason="needs the sleep command")


def test_a_run_under_the_working_folder_names_its_folder_and_report_relative(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["command", "--arms", "0.01,0.02", "--pairs", "1", "--warmup", "0", "--out", "runs", "--", "sleep"]
    assert main([*argv, "{arm}"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^run folder: runs/command-\S+  \(2 of 2 trials to run\)$", out, re.M), out
    (report,) = re.findall(r"^report: (\S+)$", out, re.M)
    assert report.startswith("runs/command-") and (tmp_path / report).is_file(), out


def test_a_run_outside_the_working_folder_names_it_whole(tmp_path: Path, capsys) -> None:
    argv = ["command", "--arms", "0.01,0.02", "--pairs", "1", "--warmup", "0", "--out", str(tmp_path), "--"]
    assert main([*argv, "sleep", "{arm}"]) == 0
    out = capsys.readouterr().out
    assert f"run folder: {tmp_path}/command-" in out and f"report: {tmp_path}/command-" in out, out
