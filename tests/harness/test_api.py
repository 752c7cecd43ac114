"""The Python API (`harness.api.compare`): paired trials of one's own functions, with the harness's
statistics, run folder and report, resumable with the same functions."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from harness.api import compare
from harness.folder_format import PLAN
from harness.tables import RunFolder


def slow() -> None:
    time.sleep(0.02)


def fast() -> None:
    time.sleep(0.005)


def test_compare_times_each_call_and_gives_the_claim(tmp_path: Path) -> None:
    result = compare({"slow": slow, "fast": fast}, pairs=4, warmup=1, bar=20, out=tmp_path)
    assert result.arms["arm"].tolist() == ["slow", "fast"]
    claim = result.claims.iloc[0]
    assert claim["arm"] == "fast" and claim["baseline_arm"] == "slow" and claim["pairs"] == 4
    assert 0.5 < claim["median"] < 0.8  # (0.02 − 0.005) / 0.02 = 75%, less the sleep's overshoot
    assert claim["estimate"] == claim["median"]  # the median, the claim's figure
    assert result.verdict() == "insufficient"  # four pairs: their range attains 87.5%, not 95%
    text = str(result)
    assert text.startswith("fast is ") and "% faster than slow (95% CI" in text and "insufficient" in text
    report = result.report()
    assert report == result.folder / "report.md" and "### Verdict" in report.read_text()
    plan = RunFolder(result.folder).read_json(PLAN)
    assert plan["tier"] == "function" and [a["label"] for a in plan["protocol"]["arms"]] == ["slow", "fast"]


def test_a_function_may_report_its_own_figure(tmp_path: Path) -> None:
    result = compare(
        {"a": lambda: {"value": 10.0, "extra": 1}, "b": lambda: {"value": 8.0}},
        pairs=2,
        warmup=0,
        out=tmp_path,
    )
    assert result.claims.iloc[0]["median"] == pytest.approx(0.2)
    assert set(result.run.summaries.trials["extra"].dropna()) == {1}


def test_compare_resumes_with_the_same_functions(tmp_path: Path) -> None:
    first = compare({"slow": slow, "fast": fast}, pairs=2, warmup=0, out=tmp_path)
    log = first.run.folder.file("trials.jsonl")
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:2]))
    again = compare({"slow": slow, "fast": fast}, resume=first.folder)
    # the schedule's four trials, and the resume's warm-up (index 4) before the next pair
    assert sorted(r["index"] for r in again.run.folder.rows()) == [0, 1, 2, 3, 4]


def test_a_control_and_bad_input(tmp_path: Path) -> None:
    # Four pairs: from 3 to 24 no nominal level of the t interval keeps 95% on the skewed law.
    result = compare({"slow": slow}, control=True, pairs=4, warmup=0, bar=50, out=tmp_path)
    assert result.claims.iloc[0]["arm"] == "slow-control" and result.verdict() == "insufficient"
    assert result.claims.iloc[0]["kind"] == "control" and result.claims.iloc[0]["bar"] == 0.5
    with pytest.raises(ValueError, match="two or more functions"):
        compare({"only": slow}, out=tmp_path)
    with pytest.raises(ValueError, match="pairs must be a positive"):
        compare({"slow": slow, "fast": fast}, pairs=0, out=tmp_path)


def test_compare_warms_up_until_two_warm_ups_agree_with_warmup_auto(tmp_path: Path) -> None:
    """`warmup="auto"` works as the CLI's `--warmup auto`: warm-ups in the arms' order until two of one arm
    agree.

    Warm 10, cold 50, warm 10: settled at the third.
    """
    calls = {"cold": 0}

    def cold() -> dict[str, float]:
        calls["cold"] += 1
        return {"value": 50.0 if calls["cold"] == 1 else 10.0}

    result = compare({"warm": lambda: {"value": 10.0}, "cold": cold}, pairs=2, warmup="auto", out=tmp_path)
    plan = RunFolder(result.folder).read_json(PLAN)
    assert plan["protocol"]["warmup"] == "auto"
    warmups = result.run.summaries.trials.query("phase == 'warmup'")
    assert warmups["arm"].tolist() == ["warm", "cold", "warm"] and warmups["value"].tolist() == [10, 50, 10]
    assert result.claims.iloc[0]["median"] == pytest.approx(0.0)


@pytest.mark.parametrize("warmup", ["often", -1, 2.5])
def test_compare_refuses_a_warmup_that_is_neither_a_count_nor_auto(tmp_path: Path, warmup) -> None:
    with pytest.raises(ValueError, match="warmup"):
        compare({"slow": slow, "fast": fast}, pairs=2, warmup=warmup, out=tmp_path)


@pytest.mark.parametrize(
    ("returned", "says"),
    [
        ({"value": 1.0, "index": 1}, "index"),
        ({"value": 1.0, "status": "ok"}, "status"),
        ({"value": 1.0, "trial_seconds": -1}, "trial_seconds"),
        ({"value": 1.0, "arm": "base"}, "arm"),
        ({"value": 1e-40}, "1e-40"),
        ({"value": 1e31}, "1e+31"),
        ({"value": 1.0, "x": object()}, "the log cannot hold"),
    ],
)
def test_a_function_returning_what_the_log_cannot_hold_is_a_failed_trial(
    tmp_path: Path, returned: dict, says: str
) -> None:
    """A figure the log's reader refuses, or a field the protocol writes itself, is the trial's recorded
    failure.

    The fields are the trial's index and status, say. The run and its report go on.
    """
    result = compare(
        {"base": lambda: {"value": 1.0}, "cand": lambda: dict(returned)}, pairs=2, warmup=0, out=tmp_path
    )
    rows = result.run.folder.rows()
    assert sorted(r["index"] for r in rows) == [0, 1, 2, 3]
    failed = [r for r in rows if r["arm"] == "cand"]
    assert [r["status"] for r in failed] == ["error", "error"]
    assert all(says in r["message"] for r in failed), failed
    assert result.report().is_file()


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"control": True}, "control=True runs the first function against itself"),
        ({"pairs": 2.5}, "pairs 2.5 is not a whole number"),
        ({"pairs": True}, "pairs True is not a whole number"),
        ({"seed": 1.5}, "seed 1.5 is not a whole number"),
        ({"bar": True}, "bar True is not a number"),
        ({"bar": "5"}, "bar '5' is not a number"),
    ],
)
def test_compare_refuses_what_it_would_drop_or_misread_before_any_trial(tmp_path: Path, given, says) -> None:
    """`compare` refuses before any trial what it would drop or misread.

    Those are control=True beside a second function, a pairs of 2.5, a bar of True, and a seed of 1.5.
    """
    with pytest.raises(ValueError, match=re.escape(says)):
        compare({"slow": slow, "fast": fast}, warmup=0, out=tmp_path, **{"pairs": 2, **given})
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("functions", "says"),
    [
        ({"slow": slow, "fast": fast}.items(), "functions must be a mapping of label to callable"),
        ([slow, fast], "functions must be a mapping of label to callable"),
        ({"slow": slow, "fast": 1}, "functions['fast'] is 1, not a callable"),
        ({1: slow, "fast": fast}, "function labels are text: 1 is not"),
        ({"": slow, "fast": fast}, "function labels are text: '' is not"),
    ],
)
def test_compare_refuses_functions_it_cannot_label_or_call_before_any_folder(
    tmp_path: Path, functions, says
) -> None:
    """`compare` refuses functions it cannot label or call, before any folder.

    Those are `compare(d.items())`, a label that is not text, and a value that is not callable.
    """
    with pytest.raises(ValueError, match=re.escape(says)):
        compare(functions, pairs=2, warmup=0, out=tmp_path)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_the_case_is_named_by_name(tmp_path: Path) -> None:
    """The case was named ``seed``: a check's loop variable took the name of the ``name`` option."""
    result = compare({"slow": slow, "fast": fast}, pairs=1, warmup=0, out=tmp_path)
    assert set(result.claims["case"]) == {"functions"}
    result = compare({"slow": slow, "fast": fast}, pairs=1, warmup=0, name="step", out=tmp_path)
    assert set(result.claims["case"]) == {"step"}


def test_compare_resume_refuses_other_functions_or_options(tmp_path: Path) -> None:
    """A resume with other functions, or with options (pairs, bar, out), is refused before anything runs."""
    first = compare({"slow": slow, "fast": fast}, pairs=2, warmup=0, out=tmp_path)
    log = first.run.folder.file("trials.jsonl")
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:2]))
    rows = log.read_bytes()
    for functions, options, says in (
        ({"x": slow, "y": fast}, {}, "the functions the run started with: slow, fast"),
        ({"slow": slow}, {}, "the functions the run started with: slow, fast"),
        ({"slow": slow, "fast": fast}, {"pairs": 100}, "pairs"),
        ({"slow": slow, "fast": fast}, {"bar": 5}, "bar"),
        ({"slow": slow, "fast": fast}, {"out": "/nonexistent"}, "out"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            compare(functions, resume=first.folder, **options)
        assert log.read_bytes() == rows


def test_a_result_names_its_folder_as_the_console_does(tmp_path: Path, monkeypatch) -> None:
    """Under the working folder, relative; elsewhere, whole: ``str`` and ``repr`` alike."""
    monkeypatch.chdir(tmp_path)
    inside = compare({"slow": slow, "fast": fast}, pairs=1, warmup=0, out="runs")
    shown = f"runs/{inside.folder.name}"
    assert str(inside).endswith(f"\nrun folder: {shown}") and repr(inside) == f"Result(folder={shown!r})"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    whole = str(tmp_path / "runs" / inside.folder.name)
    assert str(inside).endswith(f"\nrun folder: {whole}") and repr(inside) == f"Result(folder={whole!r})"
