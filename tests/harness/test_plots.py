"""The report's and the screen's plots, read back from their matplotlib figures (no GUI).

Every legend entry shows the marker it names. One extreme pair does not flatten the rest, and one scale still
spreads the arms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Annotation

from experiments.screen.plots import plot_crossover, plot_memory
from harness import plots
from harness.schedule import Arm
from harness.tier import Run
from tests.trialfns import plan_of, runner

ARMS = (
    Arm("baseline", "baseline", "baseline"),
    Arm("candidate", "candidate", "candidate"),
    Arm("candidate-cpu", "candidate", "candidate-cpu"),
)
# Per measured round; warm-ups take round 0's figure. One candidate pair is extreme: (10 − 48.7) / 10 = −387%.
FIGURES = {
    "baseline": [10.0] * 6,
    "candidate": [9.0, 9.1, 48.7, 8.9, 9.2, 9.05],
    "candidate-cpu": [8.0, 8.2, 7.9, 8.1, 8.05, 7.95],
}


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every figure saved while the test runs (the PNG is still written)."""
    figures: list[Figure] = []
    save = Figure.savefig

    def keep(self: Figure, *args, **kwargs):
        figures.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    plan = plan_of("scripted", warmup=3, pairs=6, arms=ARMS, figures=FIGURES, bar=8.0)
    return runner(tmp_path_factory.mktemp("plots")).start(plan)


def key(line: Line2D) -> tuple[str, tuple, tuple]:
    """What a reader sees of a marker: its shape, face and edge colours."""
    face = line.get_markerfacecolor()
    return (
        str(line.get_marker()),
        (0.0, 0.0, 0.0, 0.0) if str(face) == "none" else to_rgba(face),
        to_rgba(line.get_markeredgecolor()),
    )


NO_MARKER = ("", "None", "none")
CAPS = ("_", "|")  # the ends of error bars: part of a range, not a marker that names an arm


def plotted_markers(fig: Figure) -> set[tuple[str, tuple, tuple]]:
    ax = fig.axes[0]
    return {
        key(line)
        for line in ax.get_lines()
        if str(line.get_marker()) not in NO_MARKER + CAPS and len(line.get_xdata())
    }


def legend_markers(fig: Figure) -> dict[str, tuple[str, tuple, tuple]]:
    legend = fig.axes[0].get_legend()
    return {
        text.get_text(): key(handle)
        for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True)
        if isinstance(handle, Line2D) and str(handle.get_marker()) not in NO_MARKER
    }


def test_the_timeline_legend_shows_each_arms_measured_and_hollow_warmup_marker(
    run: Run, drawn: list[Figure], tmp_path: Path
) -> None:
    plots.plot_timeline(run.summaries.trials, run.plan, tmp_path / "timeline.png")
    (fig,) = drawn
    legend, plotted = legend_markers(fig), plotted_markers(fig)
    assert set(legend.values()) == plotted  # every marker drawn is in the legend, and nothing else is
    styles = plots.arm_styles(run.plan.arm_labels())
    warmup = legend["candidate warm-up (discarded)"]
    assert warmup[0] == styles["candidate"].marker == "s" and warmup[1][3] == 0  # a hollow square
    assert warmup[2] == to_rgba(plots.WARMUP_COLOR)
    assert legend["candidate (measured)"] == (
        "s",
        to_rgba(styles["candidate"].color),
        to_rgba(styles["candidate"].color),
    )


def test_the_reductions_legend_shows_each_arms_own_marker(
    run: Run, drawn: list[Figure], tmp_path: Path
) -> None:
    plots.plot_reductions(run.summaries.pairs, run.summaries.claims, run.plan, tmp_path / "reductions.png")
    (fig,) = drawn
    legend, plotted = legend_markers(fig), plotted_markers(fig)
    styles = plots.arm_styles(run.plan.arm_labels())
    for arm in ("candidate", "candidate-cpu"):
        colour = to_rgba(styles[arm].color)
        assert legend[f"one pair ({arm})"] == (styles[arm].marker, colour, colour)
    pair_markers = {m for m in plotted if m[0] not in ("<", ">")}  # the interval's arrowheads are not pairs
    assert pair_markers == set(legend.values())


def test_one_extreme_pair_is_marked_at_the_edge_and_the_bulk_stays_readable(
    run: Run, drawn: list[Figure], tmp_path: Path
) -> None:
    pairs = run.summaries.pairs
    plots.plot_reductions(pairs, run.summaries.claims, run.plan, tmp_path / "reductions.png")
    ax = drawn[0].axes[0]
    left, right = ax.get_xlim()
    mine = pairs[pairs["arm"] == "candidate"]["reduction"].to_numpy(dtype=float)
    extreme = float(mine.min())
    assert extreme < -3.8 and left > -1.0  # the axis keeps to the bulk ...
    bulk = np.concatenate([mine[mine > -1], pairs[pairs["arm"] == "candidate-cpu"]["reduction"].to_numpy()])
    assert (bulk.max() - bulk.min()) / (right - left) > 0.2  # ... which fills a fair part of it
    styles = plots.arm_styles(run.plan.arm_labels())
    square = styles["candidate"].marker
    candidate_points = [
        line for line in ax.get_lines() if str(line.get_marker()) == square and len(line.get_xdata())
    ]
    xs = np.concatenate([np.asarray(line.get_xdata(), dtype=float) for line in candidate_points])
    assert len(xs) == len(mine)  # never dropped: the extreme pair is drawn too ...
    assert np.isclose(xs.min(), left)  # ... at the edge ...
    labels = [a.get_text() for a in ax.texts if isinstance(a, Annotation)]
    assert labels == [f"← {100 * extreme:.2f}%"]  # ... with its value
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "beyond the axis: at its edge, value labelled" in legend


def test_without_an_extreme_pair_the_axis_shows_everything() -> None:
    values = np.array([0.05, 0.08, 0.11, 0.09, 0.07, 0.1])
    left, right, clipped = plots.reduction_axis(values, [0.08])
    assert not clipped and left < 0 < 0.11 < right
    left, right, clipped = plots.reduction_axis(np.append(values, -3.87), [0.08])
    assert clipped and left > -1


def screen_table(scales: list[str], floors: bool) -> pd.DataFrame:
    rows = []
    for scale in scales:
        for arm, ms in (("baseline", 90.0), ("candidate@g0", 14.0), ("upstream", 16.0)):
            rows.append(
                {
                    "x": scale,
                    "series": arm,
                    "median": ms,
                    "low": 0.95 * ms,
                    "high": 1.05 * ms,
                    "floor": ms / 4 if floors else np.nan,
                    "bytes": 2**20 * ms,
                }
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("scales", [["n"], ["n", "s", "m"]])
def test_the_crossover_spreads_the_arms_and_its_legend_matches(
    scales: list[str], drawn: list[Figure], tmp_path: Path
) -> None:
    series = ["baseline", "candidate@g0", "upstream"]
    plot_crossover(screen_table(scales, floors=True), series, scales, tmp_path / "crossover.png")
    (fig,) = drawn
    ax = fig.axes[0]
    data = [line for line in ax.get_lines() if line.get_linestyle() == "-" and len(line.get_xdata())]
    firsts = [float(np.asarray(line.get_xdata(), dtype=float)[0]) for line in data]
    assert len(data) == 3 and len(set(firsts)) == 3  # each arm has its own position, even on one scale
    assert max(firsts) - min(firsts) >= (0.5 if len(scales) == 1 else 0.25)
    left, right = ax.get_xlim()
    assert left < min(firsts) and max(firsts) < right
    legend = legend_markers(fig)
    styles = plots.arm_styles(series)
    for label in series:
        colour = to_rgba(styles[label].color)
        assert legend[label] == (styles[label].marker, colour, colour)
        assert legend[f"{label} launch floor (CUDA graph)"] == (
            styles[label].marker,
            (0.0, 0.0, 0.0, 0.0),
            colour,
        )
    assert set(legend.values()) == plotted_markers(fig)


def test_the_memory_plot_spreads_the_arms_on_one_scale(drawn: list[Figure], tmp_path: Path) -> None:
    series = ["baseline", "candidate@g0", "upstream"]
    plot_memory(screen_table(["n"], floors=False), series, ["n"], tmp_path / "memory.png")
    ax = drawn[0].axes[0]
    xs = {
        float(np.asarray(line.get_xdata(), dtype=float)[0])
        for line in ax.get_lines()
        if len(line.get_xdata())
    }
    assert len(xs) == 3
    assert set(legend_markers(drawn[0]).values()) == plotted_markers(drawn[0])
