"""The console's end-of-run summary: what the arms ran comes first, and every figure stays whole at any width.

Rich gives a terminal it cannot measure 80 columns.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from experiments.arms import arm_code
from harness.console import ScheduleProgress, print_summary
from harness.formatting import (
    format_interval,
    format_percent,
    format_percent_range,
    format_range,
    format_value,
)
from harness.plan import grow_schedule
from harness.schedule import Arm
from harness.tier import Run
from tests.trialfns import plan_of, runner

ARMS = (Arm("baseline", "baseline", "baseline"), Arm("candidate", "candidate", "candidate"))
# A loaded machine's figures: ranges as wide as the (14.9 to 140.4 s fits; a −386.83% pair).
FIGURES = {"baseline": [19.733, 14.9, 21.2, 140.412], "candidate": [16.1, 72.537, 18.004, 17.5]}


def summary_text(plan, summaries, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None, highlight=False)
    print_summary(plan, summaries, console)
    return console.export_text()


@pytest.fixture(scope="module")
def loaded_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    plan = plan_of("scripted", warmup=0, pairs=4, arms=ARMS, figures=FIGURES, device="cpu")
    plan.arm_code = arm_code(plan.cases, "cpu")  # candidate on the CPU: the baseline's code
    return runner(tmp_path_factory.mktemp("console")).start(plan)


def whole_figures(run: Run) -> list[str]:
    """Every figure the summary must show, formatted as the console formats it."""
    plan, summaries = run.plan, run.summaries
    out = []
    for _, arm in summaries.arms.iterrows():
        out += [format_value(arm["median"], plan.unit), format_range(arm["min"], arm["max"])]
    for _, claim in summaries.claims.iterrows():
        out += [format_percent(claim["estimate"]), format_percent_range(claim["min"], claim["max"])]
        out += format_interval(claim["ci_low"], claim["ci_high"]).split(" ")  # may wrap at its one space
    return out


@pytest.mark.parametrize("width", [140, 80, 60, 36])
def test_every_figure_stays_whole_at_any_width(loaded_run: Run, width: int) -> None:
    text = summary_text(loaded_run.plan, loaded_run.summaries, width)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    figures = whole_figures(loaded_run)
    assert "-386.83%" in " ".join(figures) or any("-" in f for f in figures)  # the extreme pair is there
    for figure in figures:
        assert figure in text, (figure, text)


def test_the_summary_opens_with_the_answer_and_withholds_a_same_code_verdict(loaded_run: Run) -> None:
    text = summary_text(loaded_run.plan, loaded_run.summaries, 80)
    first = " ".join(text.split("\n\n")[0].split()) if "\n\n" in text else text.splitlines()[0]
    assert first.startswith("candidate vs baseline: no difference detected")
    assert (
        "verdict withheld: candidate (optimizers.batched.BatchedMuSGD) keeps the per-parameter step"
        in " ".join(text.split())
    )
    assert str(loaded_run.summaries.claims["verdict"].iloc[0]) not in text.replace("withheld", "")


def test_a_plan_with_no_arm_record_prints_the_answer_then_the_table(tmp_path: Path) -> None:
    plan = plan_of("scripted", warmup=0, pairs=2, arms=ARMS, figures=FIGURES, device="cpu")
    run = runner(tmp_path).start(plan)
    lines = [line.strip() for line in summary_text(run.plan, run.summaries, 80).splitlines()]
    # two pairs: too few to say faster, slower or neither; the estimate and why stand in its place
    title = next(i for i, line in enumerate(lines) if line.startswith("test: test figure"))
    opening = " ".join(lines[:title])  # the answer, wrapped at 80 columns, then the table
    assert opening.startswith(
        "candidate vs baseline: -99.3% (95% CI -386.8% to 18.4%, 50.0% attained, 2 pairs)"
    )
    assert "insufficient for a verdict" in opening


def test_progress_numbers_scheduled_trials_by_their_place_and_names_warmups_outside_it(capsys) -> None:
    """The progress line counts neither a resume's warm-up nor the rounds after it as places in the schedule.

    The warm-up is logged with an index outside the schedule, and the stopping rule's next rounds take indices
    after it.
    """
    plan = plan_of("scripted", warmup=1, pairs=2, arms=ARMS, device="cpu")
    extra = len(plan.schedule)  # the resume's warm-up: the next free index, outside the schedule
    progress = ScheduleProgress(plan, len(plan.schedule), 1, quiet=True)

    def row(index: int, phase: str, arm: str, **fields: object) -> dict:
        return {
            "index": index,
            "case": "only",
            "phase": phase,
            "arm": arm,
            "status": "ok",
            "value": 1.0,
            **fields,
        }

    progress.end(row(extra, "warmup", "baseline", warmup_reason="resume"))
    for trial in plan.schedule[1:]:
        progress.end(row(trial.index, trial.phase, trial.arm))
    grow_schedule(plan, "only", 3, extra + 1)  # a look that did not stop: one round more
    progress.retotal(len(plan.schedule))
    for trial in plan.schedule[-2:]:
        progress.end(row(trial.index, trial.phase, trial.arm))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("warm-up outside the schedule (resume) only baseline: ")
    assert [line.split(" ")[1] for line in lines[1:5]] == ["2/5", "3/5", "4/5", "5/5"]
    assert [line.split(" ")[1] for line in lines[5:]] == ["6/7", "7/7"]
    assert progress.done == 7  # the bar counts the schedule's trials, not the extra warm-up
