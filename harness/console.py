"""What a person sees while a run goes: a progress bar over the schedule and a final summary table."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from harness.codepaths import verdict_shown, what_ran
from harness.formatting import (
    format_interval,
    format_percent,
    format_percent_range,
    format_range,
    format_value,
)
from harness.protocol import Plan, ScheduledTrial
from harness.sentence import answers
from harness.stats import instability_flags
from harness.tables import Summaries

# Rich falls back to 80 columns off a terminal (CI logs, pipes); tables need more to stay readable. Everything
# printed is plain text: user input, paths and install hints ('[v2]', '[/]', "pip install -e '.[ultralytics]'",
# ':100:') print as they are, never as rich markup or emoji codes; errors are never wrapped (one line each).
PLAIN = {"highlight": False, "markup": False, "emoji": False}


class ClosedPipeSafeStdout:
    """``sys.stdout`` as the console writes to it, where a reader that goes away (``bench … | head -2``) stops
    nothing: the first write that meets the closed pipe points file descriptor 1 at /dev/null (so later
    writes and the interpreter's last flush succeed too) and the run goes on."""

    def write(self, text: str) -> int:
        try:
            return sys.stdout.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            self._to_devnull()

    def isatty(self) -> bool:
        return sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", None) or "utf-8"

    @staticmethod
    def _to_devnull() -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no real descriptor (a test's capture): nothing to do
            pass


console = Console(
    file=ClosedPipeSafeStdout(),  # type: ignore[arg-type]
    width=None if sys.stdout.isatty() else 140,
    **PLAIN,
)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 140, soft_wrap=True, **PLAIN)


class ScheduleProgress:
    """A rich progress bar over the trials still to run; silent when ``quiet`` (CI logs get one line each)."""

    def __init__(self, plan: Plan, total: int, done: int, quiet: bool) -> None:
        self.plan, self.quiet, self.total, self.done = plan, quiet, total, done
        self.last = "—"
        self.progress: Progress | None = None
        if not quiet:
            self.progress = Progress(
                TextColumn("{task.description}", style="bold", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("last: {task.fields[last]}", markup=False),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
            self.task = self.progress.add_task("starting", total=total, completed=done, last=self.last)

    def __enter__(self) -> ScheduleProgress:
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress:
            self.progress.stop()

    def retotal(self, total: int) -> None:
        """The schedule grew or shrank (``--pairs auto``): the bar's total follows."""
        self.total = total
        if self.progress:
            self.progress.update(self.task, total=total)

    def place(self, index: int) -> int | None:
        """A trial's place in the schedule (1-based), or None for a warm-up logged outside it (after a resume
        or an idle gap, or of a ``--warmup auto`` sequence): log indices skip those, places do not."""
        return next((n for n, t in enumerate(self.plan.schedule, 1) if t.index == index), None)

    def describe(self, place: int | None, reason: str | None = None) -> str:
        """``trial 6/7`` for a place in the schedule, else an extra warm-up and, once known, what it was for."""
        if place is None:
            return "warm-up outside the schedule" + (f" ({reason})" if reason else "")
        return f"trial {place}/{self.total}"

    def start(self, trial: ScheduledTrial) -> None:
        label = f"{trial.case} · {trial.arm} ({trial.phase}) · {self.describe(self.place(trial.index))}"
        if self.progress:
            self.progress.update(self.task, description=label)

    def end(self, row: dict[str, Any]) -> None:
        place = self.place(row["index"])
        scheduled = place is not None
        self.done += scheduled
        figure = format_value(row.get("value"), self.plan.unit) if row["status"] == "ok" else row["status"]
        self.last = f"{row['arm']} {figure}"
        if self.progress:
            self.progress.update(self.task, advance=int(scheduled), last=self.last)
        else:
            what = self.describe(place, row.get("warmup_reason"))
            phase = f" {row['phase']}" if scheduled else ""
            console.print(f"{what} {row['case']}{phase} {row['arm']}: {figure}")


UNBOUNDED = 100_000  # measure tables as if the console had no edge (a measurement is clamped to its width)


def _cells(plan: Plan, summaries: Summaries) -> list[dict[str, str]]:
    """Per arm row: each figure as text (value and range apart, so a narrow layout can stack them); the
    reduction is the claim's primary estimate (the geometric mean), its range the pairs' min–max."""
    claims = summaries.claims.set_index(["case", "arm"]) if not summaries.claims.empty else None
    rows = []
    for _, arm in summaries.arms.iterrows():
        row = {
            "case": str(arm["case"]),
            "arm": str(arm["arm"]),
            "trials": f"{arm['trials']}" + (f" ({arm['failed']} failed)" if arm["failed"] else ""),
            "median": format_value(arm["median"], plan.unit),
            "range": f"({format_range(arm['min'], arm['max'])})",
            "reduction": "",
            "reduction_range": "",
            "interval": "",
            "verdict": "",
        }
        if claims is not None and (arm["case"], arm["arm"]) in claims.index:
            claim = claims.loc[(arm["case"], arm["arm"])]
            row.update(
                reduction=format_percent(claim["estimate"]),
                reduction_range=f"({format_percent_range(claim['min'], claim['max'])})",
                interval=format_interval(claim["ci_low"], claim["ci_high"]),
                verdict=verdict_shown(plan, str(arm["arm"]), str(claim["verdict"])),
            )
        rows.append(row)
    return rows


def _wide_table(plan: Plan, title: str, rows: list[dict[str, str]]) -> Table:
    table = Table(title=title, show_lines=False)
    columns = (
        "case",
        "arm",
        "trials",
        "median (min–max)",
        "reduction (geometric mean)",
        "interval",
        "verdict",
    )
    for column in columns:
        table.add_column(column, no_wrap=True)
    for r in rows:
        table.add_row(
            r["case"],
            r["arm"],
            r["trials"],
            f"{r['median']} {r['range']}",
            f"{r['reduction']} {r['reduction_range']}".strip(),
            r["interval"],
            r["verdict"],
        )
    return table


def _narrow_table(plan: Plan, title: str, rows: list[dict[str, str]]) -> Table:
    """The same figures with less decoration: no vertical rules, no case column for one case, and each
    value above its range, so every figure stays whole in fewer columns."""
    one_case = len({r["case"] for r in rows}) <= 1
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1),
        pad_edge=False,
        show_lines=not one_case,
    )
    columns = ([] if one_case else ["case"]) + ["arm", "trials", "median\n(min–max)", "reduction\n(min–max)"]
    for column in columns + ["interval", "verdict"]:
        table.add_column(column, no_wrap=True)
    for r in rows:
        table.add_row(
            *([] if one_case else [r["case"]]),
            r["arm"],
            r["trials"],
            f"{r['median']}\n{r['range']}",
            f"{r['reduction']}\n{r['reduction_range']}".strip(),
            "\n".join(r["interval"].split(" ")),
            r["verdict"],
        )
    return table


def _listing(plan: Plan, title: str, rows: list[dict[str, str]]) -> list[str]:
    """The same figures as lines, for a console too narrow for any table."""
    lines = [title]
    for r in rows:
        lines.append(f"{r['case']} · {r['arm']}: {r['trials']} trials, median {r['median']} {r['range']}")
        if r["reduction"]:
            lines.append(
                f"  reduction {r['reduction']} {r['reduction_range']}, interval {r['interval']}, "
                f"verdict {r['verdict']}"
            )
    return lines


def _notes(summaries: Summaries) -> list[str]:
    """What the verdicts rest on, one line each: pairs left out because both arms failed, why an interval is
    insufficient, and where a distribution-free check disagrees with the verdict."""
    notes: list[str] = []
    claims = summaries.claims
    for _, claim in claims.iterrows():
        label = f"{claim['arm']}" + (f" ({claim['case']})" if claims["case"].nunique() > 1 else "")
        if int(claim["both_failed"]):
            notes.append(f"{label}: {int(claim['both_failed'])} pair(s) where both arms failed left out")
        if not claim["ci_sufficient"] and claim["ci_reason"]:
            notes.append(f"{label}: insufficient: {claim['ci_reason']}")
    return notes


def print_summary(plan: Plan, summaries: Summaries, out: Console | None = None) -> None:
    """The answer in one sentence per claim (``harness.sentence``), what the arms ran, then per case each
    arm's median (min–max) and each other arm's reduction with its interval and verdict; then what the
    verdicts rest on (pairs left out). The method and its checks live in the report.

    The table keeps every figure whole at any width: the full layout where it fits, else a narrower one
    (less decoration, values above their ranges), else plain lines; no layout is ever squeezed by rich.
    """
    out = out or console
    said = answers(plan, summaries.claims)
    for sentence in said:
        out.print(sentence)
    line = None if said else what_ran(plan)  # else said before the run, and in claim.txt and the report
    if line:
        out.print(line)
    title = f"{plan.tier}: {plan.metric} ({plan.unit})"
    rows = _cells(plan, summaries)
    for layout in (_wide_table, _narrow_table):
        table = layout(plan, title, rows)  # no cell wraps: a layout is used only where it fits whole
        if Measurement.get(out, out.options.update_width(UNBOUNDED), table).maximum <= out.width:
            out.print(table)
            break
    else:
        for text in _listing(plan, title, rows):
            out.print(text)
    for note in _notes(summaries):
        out.print(f"  {note}")


def print_flags(summaries: Summaries, env: dict[str, Any] | None = None) -> None:
    """The instability flags of a run (spread per arm, machine load and steal), one line each; the flagged
    trials stay in every figure."""
    flags = instability_flags(summaries.trials, env)
    for flag in flags:
        errors.print(Text(f"unstable: {flag.reason} (flagged trials are kept)", style="yellow"))
