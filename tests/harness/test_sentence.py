"""The answer in one sentence, built once from a claim row.

It comes first on the console, atop claim.txt and the report, and is returned by the API. Figures that cannot
be estimated are said to be unbounded.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.formatting import format_interval
from harness.sentence import answer


def row(**given) -> dict:
    base = {
        "arm": "candidate",
        "baseline_arm": "upstream",
        "kind": "claim",
        "estimate": 0.104,
        "ci_low": 0.094,
        "ci_high": 0.115,
        "ci_level": 0.95,
        "ci_attained": 0.95,
        "ci_reason": "",
        "pairs": 4,
        "verdict": "clears",
        "bar": 0.05,
    }
    return {**base, **given}


def test_the_issue_s_example_sentence() -> None:
    assert answer(row(), "duet") == (
        "candidate is 10.4% faster than upstream (95% CI 9.4–11.5%, 4 duet pairs): clears the 5% bar"
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (
            {"estimate": -0.032, "ci_low": -0.043, "ci_high": -0.021, "bar": math.nan, "verdict": "no bar"},
            "candidate is 3.2% slower than upstream (95% CI 2.1–4.3%, 4 pairs)",
        ),
        (
            {"estimate": 0.01, "ci_low": -0.012, "ci_high": 0.034, "bar": None, "verdict": "no bar"},
            "candidate vs upstream: no difference detected (95% CI -1.2% to 3.4%, 4 pairs)",
        ),
        (
            {"ci_attained": 0.917, "verdict": "ambiguous", "ci_low": 0.03, "bar": 0.05},
            "candidate is 10.4% faster than upstream (95% CI 3.0–11.5%, 91.7% attained, 4 pairs): "
            "ambiguous: the interval straddles the 5% bar",
        ),
    ],
)
def test_without_a_bar_the_interval_s_sign_says_faster_slower_or_nothing(given: dict, expected: str) -> None:
    assert answer(row(**given)) == expected


def test_an_interval_that_cannot_be_estimated_is_unbounded_never_twenty_digits() -> None:
    wide = row(ci_low=-553260474169635766272.0, ci_high=1.0, pairs=2, verdict="insufficient", ci_reason="")
    text = answer(wide)
    assert "unbounded" in text and "553260" not in text and "insufficient" in text
    assert format_interval(-553260474169635766272.0, 1.0) == "unbounded"
    assert format_interval(-0.5, 0.2) == "[-50.00%, 20.00%]"


def test_the_console_opens_with_the_answer_and_fits_in_15_lines_at_80_columns(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from harness import console
    from harness.cli import main
    from tests.runfolders import only_run

    monkeypatch.setattr(console.console, "width", 80)  # a terminal of 80 columns
    out = tmp_path / "runs"
    argv = ["screen", "--arms", "baseline,candidate-cpu", "--device", "cpu", "--scales", "n", "--steps", "1"]
    argv += ["--warmup-steps", "0", "--warmup", "0", "--pairs", "2", "--bar", "5", "--guards", "256"]
    assert main([*argv, "--out", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    # the answer's line ("... is N% faster" or "... vs ...: no difference"); the what-ran line may wrap onto a
    # line that starts with the arm's label too
    start = next(
        i for i, x in enumerate(lines) if x.startswith(("candidate-cpu@g256 is ", "candidate-cpu@g256 vs "))
    )
    summary = lines[start:]
    assert len(summary) <= 15, "\n".join(summary)
    assert summary[-1].startswith("report: ")  # a path is never wrapped
    assert all(len(line) <= 80 for line in summary[:-1]), "\n".join(summary)
    folder = only_run(out)
    said = folder.file("claim.txt").read_text().splitlines()[0]
    assert said.startswith(summary[0].rstrip()) and "% bar" in said
    assert said in folder.file("report.md").read_text()


def test_the_api_returns_the_answer_and_prints_nothing_when_quiet(tmp_path: Path, capsys) -> None:
    from harness.api import compare

    def slow() -> None:
        sum(range(20_000))

    def fast() -> None:
        sum(range(10_000))

    result = compare({"slow": slow, "fast": fast}, pairs=2, warmup=0, bar=5, out=tmp_path, quiet=True)
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == ""
    assert len(result.answers) == 1 and result.answers[0].startswith("fast ")
    assert str(result).splitlines()[0] == result.answers[0]
    said = result.run.folder.file("claim.txt").read_text().splitlines()[0]
    assert said == result.answers[0]
