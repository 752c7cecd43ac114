"""Your own command as a tier: a fresh process per trial, {arm} substituted, the same protocol; two commands
of known relative cost (a busy loop of N and 1.1 N iterations) come back with the known 10%."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from harness.cli import main
from tests.runfolders import only_run

# A busy loop of {arm} iterations; it prints its own process CPU time, which waiting on a loaded machine does
# not inflate (its wall time would). The figure is read with --figure.
LOOP = (
    "import sys, time\n"
    "n = int(sys.argv[1]); t = time.process_time(); x = 0\n"
    "for i in range(n):\n    x += i\n"
    "print('cpu', time.process_time() - t)"
)


def test_two_commands_of_known_relative_cost_give_the_known_ten_percent(tmp_path: Path, capsys) -> None:
    """Calibration: on this 2-core machine at load 5, the per-pair reduction of 3.0M vs 3.3M iterations had a
    spread of about 7 points (10 standalone pairs, -2.9% to -28.5%). With 12 pairs the range of the pair
    reductions (min-max) is a distribution-free 99.95% interval for their median (1 - 2/2^12), so it misses
    -10% in under 0.1% of runs. The pairs' median has a standard error of about 2.5 points (1.25 x 7 / sqrt 12),
    so 8 points is over 3 of them. The 95% t interval would miss in 5% of runs, too often for a test: only its
    width is held, to 0.5 (a run through this test at load 5 gave -22.0% to -1.7%, 0.20 wide, with one pair
    at -46.6%)."""
    out = tmp_path / "runs"
    argv = ["command", "--arms", "n=3000000,more=3300000", "--pairs", "12", "--warmup", "1"]
    argv += ["--figure", r"cpu ([0-9.e-]+)", "--no-report", "--out", str(out)]
    assert main([*argv, "--", sys.executable, "-c", LOOP, "{arm}"]) == 0
    claim = pd.read_csv(only_run(out).file("claims.csv")).iloc[0]
    assert claim["arm"] == "more" and int(claim["pairs"]) == 12
    # 1.1 N iterations cost 10% more: a reduction of 1 - 1.1 = -10%.
    assert claim["min"] <= -0.10 <= claim["max"], (claim["min"], claim["max"])
    assert abs(claim["median"] + 0.10) < 0.08, claim["median"]
    assert claim["ci_high"] - claim["ci_low"] < 0.5  # the primary interval says something
    answer = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("more "))
    assert "(95% CI" in answer and "12 pairs" in answer


def test_the_command_s_wall_time_is_the_figure_and_a_failing_command_is_an_error(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "runs"
    argv = ["command", "--arms", "ok=0,bad=3", "--pairs", "1", "--warmup", "0", "--no-report", "--quiet"]
    code = main(
        [
            *argv,
            "--out",
            str(out),
            "--",
            sys.executable,
            "-c",
            "import sys; sys.exit(int(sys.argv[1]))",
            "{arm}",
        ]
    )
    assert code == 3  # every trial of 'bad' failed
    rows = {r["arm"]: r for r in only_run(out).rows()}
    assert rows["ok"]["status"] == "ok" and 0 < rows["ok"]["value"] < 60
    assert rows["bad"]["status"] == "error" and "exited 3" in rows["bad"]["message"]


def test_a_command_without_an_arm_placeholder_is_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "runs"
    assert main(["command", "--arms", "a,b", "--out", str(out), "--", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "names no arm" in err
    assert not out.exists() or not any(out.iterdir())
