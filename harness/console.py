"""What a person sees: a progress bar over the schedule, a final summary table, and errors with hints."""

from __future__ import annotations

import os
import sys
import time
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.file_proxy import FileProxy
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn
from rich.table import Column, Table
from rich.text import Text

from harness.codepaths import verdict_shown, what_ran
from harness.estimate import seconds_left
from harness.formatting import (
    format_interval,
    format_percent,
    format_percent_range,
    format_range,
    format_value,
)
from harness.instability import run_flags as instability_flags
from harness.plan import Plan
from harness.schedule import ScheduledTrial
from harness.sentence import answers
from harness.tables import Summaries

# Off a terminal (CI logs, pipes) lines wrap at 100 columns, rich's 80 being too narrow for the tables.
# Everything printed is plain text: user input, paths and install hints ('[v2]', "pip install -e '.[x]'")
# print as they are, never as rich markup or emoji codes. An error's lines are never wrapped.
WIDTH = 100
PLAIN = {"highlight": False, "markup": False, "emoji": False}


class SafeStream:
    """A standard stream as the consoles write to it: nothing a reader or the terminal does stops the run."""

    def __init__(self, name: str, past_live_proxy: bool) -> None:
        self.name, self.past_live_proxy = name, past_live_proxy

    def _stream(self) -> Any:
        stream = getattr(sys, self.name, None)
        while self.past_live_proxy and isinstance(stream, FileProxy):
            stream = stream.rich_proxied_file
        return stream

    def _guarded(self, call: Callable[[Any], Any], default: Any = None) -> Any:
        """``call(stream)``: a missing or closed stream gives ``default``; a broken pipe goes to /dev/null."""
        stream = self._stream()
        try:
            return default if stream is None else call(stream)
        except BrokenPipeError:
            self._to_devnull(stream)
        except ValueError:  # a stream the program closed itself: nothing to write to
            pass
        return default

    def write(self, text: str) -> int:
        def put(stream: Any) -> None:
            try:
                stream.write(text)
            except UnicodeEncodeError:
                stream.write(text.encode(self.encoding, "replace").decode(self.encoding))

        self._guarded(put)
        return len(text)

    def flush(self) -> None:
        self._guarded(lambda stream: stream.flush())

    def isatty(self) -> bool:
        return bool(self._guarded(lambda stream: stream.isatty(), False))

    def fileno(self) -> int:
        stream = self._stream()
        if stream is None:
            raise OSError(f"sys.{self.name} is closed")
        return stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream(), "encoding", None) or "utf-8"

    @staticmethod
    def _to_devnull(stream: Any) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no real descriptor (a test's capture): nothing to do
            pass


_stdout, _stderr = SafeStream("stdout", past_live_proxy=True), SafeStream("stderr", past_live_proxy=False)
console = Console(file=_stdout, width=None if _stdout.isatty() else WIDTH, **PLAIN)  # type: ignore[arg-type]
errors = Console(  # type: ignore[arg-type]
    file=_stderr, width=None if _stderr.isatty() else WIDTH, soft_wrap=True, **PLAIN
)


def shown_path(path: os.PathLike[str] | str) -> str:
    """A path as the console shows it: relative to the working folder when inside it, else whole."""
    whole = os.path.abspath(path)
    inside = os.path.relpath(whole)
    return whole if inside == os.pardir or inside.startswith(os.pardir + os.sep) else inside


def one_line(text: str) -> str:
    """``text`` with control characters written as escapes, so a quoted value cannot break the line."""
    return "".join(ascii(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in text)


def print_error(message: str, hint: str | None = None) -> None:
    """``bench: error: <message>`` on stderr, then ``hint: <hint>`` on a line of its own if given."""
    errors.print(f"bench: error: {one_line(message)}", soft_wrap=True)
    if hint:
        errors.print(f"hint: {one_line(hint)}", soft_wrap=True)


class TwoLineProgress(Progress):
    """The bar on one line; the case and the last trial's figure below it, so neither squeezes the bar."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            case = task.fields.get("case")
            yield Text(f"  {case + ' · ' if case else ''}last: {task.fields.get('last', '—')}", no_wrap=True)


class TimeColumn(ProgressColumn):
    """``0:01:05 elapsed · about 0:03:10 left``."""

    def render(self, task: Task) -> Text:
        elapsed = _clock(task.elapsed or 0.0)
        left, stamp = task.fields.get("left"), task.fields.get("left_at")
        if left is None or stamp is None:
            return Text(f"{elapsed} elapsed")
        return Text(f"{elapsed} elapsed, about {_clock(max(left - (time.monotonic() - stamp), 0.0))} left")


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class ScheduleProgress:
    """A rich progress bar over the trials still to run; silent when ``quiet`` (CI logs get one line each)."""

    def __init__(
        self, plan: Plan, total: int, done: int, quiet: bool, rows: list[dict[str, Any]] | None = None
    ) -> None:
        self.plan, self.quiet, self.total, self.done = plan, quiet, total, done
        self.rows = list(rows or [])  # the log so far: what the time left is estimated from
        self.last = "—"
        self.progress: Progress | None = None
        if not quiet:
            self.progress = TwoLineProgress(
                TextColumn(
                    "{task.description}", style="bold", markup=False, table_column=Column(no_wrap=True)
                ),
                BarColumn(bar_width=20),
                MofNCompleteColumn(table_column=Column(no_wrap=True)),
                TimeColumn(table_column=Column(no_wrap=True)),
                console=console,
                transient=False,
            )
            self.task = self.progress.add_task(
                "starting", total=total, completed=done, last=self.last, **self._time_left()
            )

    def _time_left(self) -> dict[str, float | None]:
        return {"left": seconds_left(self.plan, self.rows), "left_at": time.monotonic()}

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
            self.progress.update(self.task, total=total, **self._time_left())

    def place(self, index: int) -> int | None:
        """A trial's place in the schedule (1-based), or None for a warm-up logged outside it."""
        return next((n for n, t in enumerate(self.plan.schedule, 1) if t.index == index), None)

    def describe(self, place: int | None, reason: str | None = None) -> str:
        """``trial 6/7`` for a place in the schedule, else an extra warm-up and, once known, what it was for."""
        if place is None:
            return "warm-up outside the schedule" + (f" ({reason})" if reason else "")
        return f"trial {place}/{self.total}"

    def start(self, trial: ScheduledTrial) -> None:
        phase = "" if trial.phase == "measured" else f" ({trial.phase})"
        label = f"{self.describe(self.place(trial.index))} · {trial.arm}{phase}"
        if self.progress:
            self.progress.update(self.task, description=label, case=trial.case)

    def end(self, row: dict[str, Any]) -> None:
        place = self.place(row["index"])
        scheduled = place is not None
        self.done += scheduled
        figure = format_value(row.get("value"), self.plan.unit) if row["status"] == "ok" else row["status"]
        self.last = f"{row['arm']} {figure}"
        self.rows.append(row)
        if self.progress:
            self.progress.update(self.task, advance=int(scheduled), last=self.last, **self._time_left())
        else:
            what = self.describe(place, row.get("warmup_reason"))
            phase = f" {row['phase']}" if scheduled else ""
            console.print(f"{what} {row['case']}{phase} {row['arm']}: {figure}")


UNBOUNDED = 100_000  # measure tables as if the console had no edge (a measurement is clamped to its width)


def _cells(plan: Plan, summaries: Summaries) -> list[dict[str, str]]:
    """Per arm row: each figure as text, value and range apart."""
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


def _table(title: str, rows: list[dict[str, str]], narrow: bool) -> Table:
    """The figures as a table; narrow: no vertical rules or lone case column, each value above its range."""
    one_case = narrow and len({r["case"] for r in rows}) <= 1
    sep = "\n" if narrow else " "
    style = (
        {"box": box.SIMPLE_HEAD, "show_edge": False, "padding": (0, 1), "pad_edge": False} if narrow else {}
    )
    table = Table(title=title, show_lines=narrow and not one_case, **style)
    reduction = "reduction\n(min–max)" if narrow else "reduction (median)"
    columns = ([] if one_case else ["case"]) + ["arm", "trials", f"median{sep}(min–max)", reduction]
    for column in columns + ["interval", "verdict"]:
        table.add_column(column, no_wrap=True)
    for r in rows:
        table.add_row(
            *([] if one_case else [r["case"]]),
            r["arm"],
            r["trials"],
            f"{r['median']}{sep}{r['range']}",
            f"{r['reduction']}{sep}{r['reduction_range']}".strip(),
            sep.join(r["interval"].split(" ")),
            r["verdict"],
        )
    return table


def _listing(title: str, rows: list[dict[str, str]]) -> list[str]:
    """The same figures as lines, for a console too narrow for any table."""
    lines = [title]
    for r in rows:
        lines.append(f"{r['case']} · {r['arm']}: {r['trials']} trials, median {r['median']} {r['range']}")
        if r["reduction"]:
            lines.append(
                f"  reduction {r['reduction']} {r['reduction_range']}; interval {r['interval']}: {r['verdict']}"
            )
    return lines


def _notes(plan: Plan, summaries: Summaries, said: list[str]) -> list[str]:
    """What the verdicts rest on, one line each; a reason the answer already gave is not repeated."""
    notes: list[str] = []
    claims = summaries.claims
    for _, claim in claims.iterrows():
        label = f"{claim['arm']}" + (f" ({claim['case']})" if claims["case"].nunique() > 1 else "")
        if int(claim["both_failed"]):
            notes.append(f"{label}: {int(claim['both_failed'])} pair(s) where both arms failed left out")
        if verdict_shown(plan, str(claim["arm"]), str(claim["verdict"])) != str(claim["verdict"]):
            continue  # the arm ran the baseline's code: its interval measures noise, and no verdict is given
        if (
            not claim["ci_sufficient"]
            and claim["ci_reason"]
            and not any(claim["ci_reason"] in s for s in said)
        ):
            notes.append(f"{label}: insufficient: {claim['ci_reason']}")
    return notes


def print_summary(plan: Plan, summaries: Summaries, out: Console | None = None) -> None:
    """The answer per claim, what the arms ran, per case each arm's figures, and what verdicts rest on."""
    out = out or console
    said = answers(plan, summaries.claims)
    for sentence in said:
        out.print(sentence)
    line = None if said else what_ran(plan)  # else said before the run, and in claim.txt and the report
    if line:
        out.print(line)
    title = f"{plan.tier}: {plan.metric} ({plan.unit})"
    rows = _cells(plan, summaries)
    for narrow in (False, True):
        table = _table(title, rows, narrow)  # no cell wraps: a layout is used only where it fits whole
        if Measurement.get(out, out.options.update_width(UNBOUNDED), table).maximum <= out.width:
            out.print(table)
            break
    else:
        for text in _listing(title, rows):
            out.print(text)
    for note in _notes(plan, summaries, said):
        out.print(f"  {note}")


def print_flags(summaries: Summaries, env: dict[str, Any] | None = None) -> None:
    """The instability flags of a run (spread per arm, machine load and steal), one line each."""
    flags = instability_flags(summaries.trials, env)
    for flag in flags:
        errors.print(
            Text(f"unstable: {flag.reason} (flagged trials are kept)", style="yellow"), soft_wrap=False
        )
