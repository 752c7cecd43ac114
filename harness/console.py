"""What a person sees while a run goes: a progress bar over the schedule and a final summary table."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from harness.formatting import (
    format_interval,
    format_percent,
    format_percent_range,
    format_range,
    format_value,
)
from harness.protocol import Plan, ScheduledTrial
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

    def start(self, trial: ScheduledTrial) -> None:
        label = f"{trial.case} · {trial.arm} ({trial.phase}) · trial {trial.index + 1} of {self.total}"
        if self.progress:
            self.progress.update(self.task, description=label)

    def end(self, row: dict[str, Any]) -> None:
        self.done += 1
        figure = format_value(row.get("value"), self.plan.unit) if row["status"] == "ok" else row["status"]
        self.last = f"{row['arm']} {figure}"
        if self.progress:
            self.progress.update(self.task, advance=1, last=self.last)
        else:
            console.print(
                f"trial {row['index'] + 1}/{self.total} {row['case']} {row['phase']} {row['arm']}: {figure}"
            )


def print_summary(plan: Plan, summaries: Summaries) -> None:
    """Per case: each arm's median (min–max); each candidate's paired reduction, interval and verdict."""
    table = Table(title=f"{plan.tier}: {plan.metric} ({plan.unit}), measured trials only", show_lines=False)
    for column in (
        "case",
        "arm",
        "trials",
        "median (min–max)",
        "reduction median (min–max)",
        "interval",
        "verdict",
    ):
        table.add_column(column)
    claims = summaries.claims.set_index(["case", "arm"]) if not summaries.claims.empty else None
    for _, arm in summaries.arms.iterrows():
        figure = f"{format_value(arm['median'], plan.unit)} ({format_range(arm['min'], arm['max'])})"
        failed = Text(f" {arm['failed']} failed" if arm["failed"] else "", style="red")
        reduction = interval = verdict = ""
        if claims is not None and (arm["case"], arm["arm"]) in claims.index:
            claim = claims.loc[(arm["case"], arm["arm"])]
            reduction = (
                f"{format_percent(claim['median'])} ({format_percent_range(claim['min'], claim['max'])})"
            )
            interval = format_interval(claim["ci_low"], claim["ci_high"])
            verdict = str(claim["verdict"])
        table.add_row(
            str(arm["case"]),
            str(arm["arm"]),
            Text.assemble(str(arm["trials"]), failed),
            figure,
            reduction,
            interval,
            verdict,
        )
    console.print(table)
