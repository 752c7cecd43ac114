"""The report as one Section tree: a screen of a single guard reads without stray blank lines."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from experiments.arms import arm_code
from experiments.screen import plan as screen_plan
from experiments.tiers import TIERS
from harness.cli import main
from harness.options import protocol_options
from harness.present.model import Image, Section, Table, markdown
from harness.trial import TrialContext
from tests.trialfns import runner

MiB = 2**20
FIGURES = {"baseline": (90.0, 20.0), "candidate@g256": (6.0, 3.0)}  # invented: ms/step and floor ms


def _trial(ctx: TrialContext) -> dict[str, Any]:
    ms, floor = FIGURES[ctx.arm.label]
    factor = 1 + 0.01 * ctx.trial.round
    return {
        "value": ms * factor,
        "host_ms": 0.9 * ms * factor,
        "floor_ms": floor,
        "floor_note": "",
        "extra_peak_bytes": 5 * MiB,
        "state_bytes": MiB,
        "peak_allocated": 9 * MiB,
    }


def test_single_guard_screen_report_has_no_double_blank_line(tmp_path: Path) -> None:
    """One guard screened: no guard bullets, and the supported guard follows the table after one blank line."""
    protocol = protocol_options(arms="baseline,candidate", pairs=2, warmup=0, device="cpu")
    settings = screen_plan.ScreenSettings(scales="n", guards="256", steps=4, warmup_steps=1)
    plan = screen_plan.make_plan(protocol, settings)
    plan.protocol = dataclasses.replace(plan.protocol, device="cuda")  # the log stands for a GPU run's
    plan.arm_code = arm_code(plan.cases, "cuda")
    folder = runner(tmp_path, tiers=TIERS).start(plan, _trial).folder
    assert main(["report", str(folder.path)]) == 0
    text = (folder.path / "report.md").read_text()
    assert "**The data supports guard 256**" in text
    assert "\n\n\n" not in text


def test_nested_sections_tables_and_images_render_in_order(tmp_path: Path) -> None:
    table = Table.of(
        {"arm": lambda r: r[0], "ms": lambda r: f"{r[1]:.1f}"}, [("a", 1.0), ("b|c", 2.25)], "lr"
    )
    inner = Section("Inner", depth=4).add("Text.", Image(tmp_path / "figs" / "x y.png", "cap"))
    outer = Section("Outer").add("Lead.", table, None, "", inner)
    assert markdown(outer) == [
        "### Outer",
        "",
        "Lead.",
        "",
        "| arm | ms |\n| --- | ---: |\n| a | 1.0 |\n| b\\|c | 2.2 |",
        "",
        "#### Inner\n\nText.\n\n![cap](<figs/x y.png>)",
    ]
