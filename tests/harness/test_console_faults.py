"""Console text is plain text: user text in errors, paths and labels print verbatim."""

from __future__ import annotations

from pathlib import Path

from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.schedule import Arm, Case
from tests.argv import EMBEDDED
from tests.trialfns import runner


def test_user_text_in_errors_prints_verbatim(tmp_path: Path, bench, monkeypatch) -> None:
    out = str(tmp_path / "runs")
    bench.refused([*EMBEDDED[:1], "--workload", "[/]", "--out", out], "--workload '[/]' is not")
    odd = tmp_path / "results[v2]" / "x:100:y [bold]"
    bench.refused(["pair", "--resume", str(odd)], f"'{odd}' is not a run folder")
    monkeypatch.setattr("experiments.fit.plan.ultralytics_importable", lambda: False)
    bench.refused(
        ["pair", "--workload", "ultralytics", "--device", "cpu", "--out", out],
        "install the extra (pip install -e '.[ultralytics]')",
    )


def test_paths_and_labels_print_verbatim_on_stdout_and_in_the_progress_bar(tmp_path: Path, capsys) -> None:
    arms = (Arm("base[red]", "baseline", "x"), Arm("cand[/]", "candidate", "y"))
    plan = Plan(
        tier="test",
        protocol=ProtocolOptions(arms, warmup=0, pairs=1),
        cases=[Case("[bold]case[/bold] :100:", {}, arms)],
        unit="ms",
        metric="test figure",
        settings={"behaviour": "sleepy"},
    )
    out = tmp_path / ("results[v2]" + "-long" * 12)  # longer than a line: the path line is never wrapped
    for quiet in (True, False):
        folder = runner(out, quiet=quiet).start(plan).folder
        printed = capsys.readouterr().out
        assert f"run folder: {folder.path}  (2 of 2 trials to run)" in printed, printed
        assert "cand[/]" in printed and "base[red]" in printed
