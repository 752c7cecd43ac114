"""A run folder is data: an edited folder never runs code, follows no link, and claims nothing it did not measure.

Each case does what a user (or whoever handed them a folder) can do: edit a stopped run's plan, put a file or a
link in it, then resume it or ask for its report. Every refusal is one line and exit status 2; nothing runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.cli import main
from harness.tables import LOG, PLAN
from tests.runfolders import only_run

SCREEN = [
    "screen",
    "--device",
    "cpu",
    "--scales",
    "n",
    "--guards",
    "0",
    "--steps",
    "1",
    "--warmup-steps",
    "0",
]
SCREEN += ["--warmup", "0", "--pairs", "2", "--arms", "baseline,candidate-cpu"]


def _stopped_screen(root: Path) -> Path:
    """A finished two-pair screen cut back to its first row: a run stopped after one trial."""
    assert main([*SCREEN, "--out", str(root)]) == 0
    folder = only_run(root).path
    log = folder / LOG
    log.write_text(log.read_text().splitlines(keepends=True)[0])
    return folder


def _resume(argv: list[str], capsys) -> int:
    capsys.readouterr()  # the start's console
    return main(argv)


def _one_line_refusal(capsys, code: int, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for word in words:
        assert word in err, err
    return err


PAYLOAD = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from optimizers import MuSGD as Opt
"""


def test_a_plan_naming_code_in_its_own_folder_is_refused_before_it_runs(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(
        str(tmp_path)
    )  # `runs` in the working directory imports as a namespace package
    folder = _stopped_screen(tmp_path / "runs")
    marker = tmp_path / "payload-ran"
    (folder / "payload.py").write_text(PAYLOAD.format(marker=str(marker)))
    spec = f"runs.{folder.name}.payload:Opt"

    for name in (PLAN, LOG):  # every place the folder names the spec, labels too, consistently
        (folder / name).write_text((folder / name).read_text().replace("candidate-cpu", spec))
    rows_before = (folder / LOG).read_text()
    code = _resume(["screen", "--resume", str(folder)], capsys)
    _one_line_refusal(capsys, code, "run folder", "data, not code")
    assert not marker.exists()
    assert (folder / LOG).read_text() == rows_before
    sys.modules.pop("runs", None)


def test_a_resume_refuses_an_arm_whose_code_changed_since_the_start(tmp_path, monkeypatch, capsys) -> None:
    """A spec that names code outside any folder: resolved as at the start, and its recorded fingerprint
    must match, so rows logged under one label never come from two codes."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mine_a43.py").write_text("from optimizers import MuSGD as Opt\n")
    root = tmp_path / "runs"
    argv = [*SCREEN[:-1], "baseline,mine_a43:Opt", "--out", str(root)]
    assert main(argv) == 0
    folder = only_run(root).path
    log = folder / LOG
    log.write_text(log.read_text().splitlines(keepends=True)[0])
    (tmp_path / "mine_a43.py").write_text("from optimizers import BatchedMuSGD as Opt\n")
    sys.modules.pop("mine_a43", None)
    rows_before = log.read_text()
    code = _resume(["screen", "--resume", str(folder)], capsys)
    _one_line_refusal(capsys, code, "mine_a43:Opt", "changed")
    assert log.read_text() == rows_before


def test_a_resume_checks_the_torchrun_options_as_the_start_does(tmp_path, capsys) -> None:
    """settings.torchrun edited to name a script: the start refuses it, so a resume (and a report) does too."""
    root = tmp_path / "runs"
    tiny = ["--workload", "embedded", "--images", "8", "--batch", "4", "--steps", "2", "--val-images", "4"]
    argv = ["pair", *tiny, "--gpus", "2", "--device", "cpu", "--warmup", "0", "--pairs", "1", "--quiet"]
    assert main([*argv, "--out", str(root)]) == 0
    folder = only_run(root).path
    (folder / LOG).write_text("")  # stopped before its first trial
    marker = tmp_path / "script-ran"
    (folder / "script.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    plan = json.loads((folder / PLAN).read_text())
    plan["settings"]["torchrun"] = str(folder / "script.py")
    (folder / PLAN).write_text(json.dumps(plan))
    code = _resume(["pair", "--resume", str(folder)], capsys)
    _one_line_refusal(capsys, code, "settings", "torchrun")
    assert not marker.exists() and (folder / LOG).read_text() == ""
    code = _resume(["report", str(folder), "-o", str(tmp_path / "report.md")], capsys)
    _one_line_refusal(capsys, code, "torchrun")
