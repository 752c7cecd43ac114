"""Re-read every committed claim with today's statistics, old and new side by side.

Usage: ``python scripts/reread_claims.py [--root reports] [--out reports/h200-decisive/claims.md]
[--old-commit COMMIT]``.

- Old: the figures each folder's ``claims.csv`` holds, as the run's statistics wrote them (with
  ``--old-commit``, as that commit holds them: ``bench report --tables`` rewrites the files).
- New: the same folder's log read by ``harness.stats`` today (``Run.load``).
- The section opens ``--out`` on a five-line headline, between two markers; a second run replaces it.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.tiers import TIERS  # noqa: E402
from harness.tables import RunFolder  # noqa: E402
from harness.tier import Run  # noqa: E402

START, END = "<!-- reread: start -->", "<!-- reread: end -->"
HEADLINE = 5  # lines


@dataclass(frozen=True)
class Reread:
    """One claim, old and new: estimate, interval, verdict and pairs (reductions as fractions)."""

    folder: str
    case: str
    arm: str
    baseline: str
    kind: str
    pairs: int
    old: tuple[float, float, float, str]
    new: tuple[float, float, float, str]

    @property
    def changed(self) -> bool:
        return self.old[3] != self.new[3]


def _figures(row: pd.Series) -> tuple[float, float, float, str]:
    return float(row["estimate"]), float(row["ci_low"]), float(row["ci_high"]), str(row["verdict"])


def old_claims(path: Path, commit: str | None) -> pd.DataFrame | None:
    """A ``claims.csv`` as the working tree holds it, or as ``commit`` does (None: not there)."""
    if commit is None:
        return pd.read_csv(path)
    here = path.resolve().relative_to(ROOT).as_posix()
    for then in dict.fromkeys([here, here.replace("reports/archive/", "reports/", 1)]):  # archived since
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:{then}"], capture_output=True, text=True
        )
        if shown.returncode == 0:
            return pd.read_csv(io.StringIO(shown.stdout))
    return None  # a folder committed after ``commit``: it has no old figures


def reread(root: Path, commit: str | None = None) -> list[Reread]:
    """Every claim of every run folder under ``root`` that holds a ``claims.csv``, old beside new."""
    out = []
    for plan in sorted(root.rglob("plan.json")):
        folder = plan.parent
        if not (folder / "claims.csv").is_file():
            continue
        old = old_claims(folder / "claims.csv", commit)
        if old is None:
            continue
        new = Run.load(RunFolder.open(folder), tiers=TIERS).summaries.claims
        for _, row in old.iterrows():
            match = new[(new["case"] == row["case"]) & (new["arm"] == row["arm"])]
            if match.empty:
                continue
            now = match.iloc[0]
            name = str(folder.relative_to(root))
            out.append(
                Reread(name, str(row["case"]), str(row["arm"]), str(row["baseline_arm"]), str(now["kind"]),
                       int(now["pairs"]), _figures(row), _figures(now))
            )  # fmt: skip
    return out


def _shown(figures: tuple[float, float, float, str]) -> str:
    estimate, low, high, verdict = figures
    return f"{estimate:.2%} [{low:.2%}, {high:.2%}] {verdict}"


def headline(rows: list[Reread]) -> list[str]:
    """Five lines: what this is, how many verdicts changed, and the decisive pair claims old → new."""
    changed = [r for r in rows if r.changed]
    words = sum(1 for r in changed if r.old[3] in ("no bar", "no tolerance"))
    pairs = [r for r in rows if "pair-" in r.folder and r.kind == "claim" and r.pairs >= 6]
    lines = [
        "# Committed claims re-read with today's statistics (old: each folder's claims.csv; new: its log)",
        f"{len(rows)} claims in {len({r.folder for r in rows})} folders; {len(changed)} verdicts changed. "
        f"{words} were 'no bar' or 'no tolerance': now a direction, or insufficient below 5 pairs.",
    ]
    for r in sorted(pairs, key=lambda r: -r.pairs)[: HEADLINE - 2]:
        lines.append(f"{r.arm} vs {r.baseline}, {r.pairs} pairs: {_shown(r.old)} → {_shown(r.new)}.")
    lines += ["No decisive pair claim to show."] * (HEADLINE - len(lines))
    return [line if i == 0 else f"- {line}" for i, line in enumerate(lines)]


def render(rows: list[Reread]) -> str:
    table = [
        "| folder | case | arm vs baseline | kind | pairs | old: estimate [interval] verdict | new |",
        "| --- | --- | --- | --- | ---: | --- | --- |",
    ]
    for r in rows:
        table.append(
            f"| `{r.folder}` | {r.case} | {r.arm} vs {r.baseline} | {r.kind} | {r.pairs} | {_shown(r.old)} | "
            f"{_shown(r.new)}{' (changed)' if r.changed else ''} |"
        )
    note = "Made by `scripts/reread_claims.py`; the report below is the runs' own, as committed."
    return "\n".join([START, *headline(rows), "", *table, "", note, END, ""])


def insert(text: str, section: str) -> str:
    """``section`` at the top of ``text``, in place of an earlier one."""
    if START in text and END in text:
        text = text[: text.index(START)] + text[text.index(END) + len(END) :].lstrip("\n")
    return section + "\n" + text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT / "reports")
    parser.add_argument("--out", type=Path, default=ROOT / "reports/h200-decisive/claims.md")
    parser.add_argument("--old-commit", help="read the old claims.csv files as this commit holds them")
    args = parser.parse_args()
    rows = reread(args.root, args.old_commit)
    section = render(rows)
    existing = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    args.out.write_text(insert(existing, section), encoding="utf-8")
    print("\n".join(headline(rows)))


if __name__ == "__main__":
    main()
