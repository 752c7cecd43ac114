"""The screen's plots: the crossover (ms/step against scale, floors dashed) and the extra peak memory."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from harness.plot_style import MarkStyle, arm_styles, figure, legend_right

CROSSOVER_PNG = "screen_crossover.png"
MEMORY_PNG = "screen_memory.png"


def plot_crossover(
    table: pd.DataFrame,
    series: Sequence[str],
    x_order: Sequence[str],
    path: Path,
    title: str = "crossover",
    unit: str = "ms/step",
) -> Path:
    """A crossover plot (the screen's): one line per series over categorical x, log y."""
    styles, positions, offsets = _layout(series, x_order)
    lines: list[str] = []  # series drawn, in order (each gets a legend entry drawn as it is)
    floors: list[str] = []
    with figure(path, width=10.0, height=5.4) as (fig, ax):
        ax.set_yscale("log")
        for label in series:
            rows = _ordered(table, label, positions)
            median = pd.to_numeric(rows["median"], errors="coerce").to_numpy(dtype=float)
            keep = np.isfinite(median) & (median > 0)
            if not keep.any():
                continue
            style = styles[label]
            x = rows["pos"].to_numpy(dtype=float)[keep] + offsets[series.index(label)]
            low = pd.to_numeric(rows["low"], errors="coerce").to_numpy(dtype=float)[keep]
            high = pd.to_numeric(rows["high"], errors="coerce").to_numpy(dtype=float)[keep]
            low, high = (
                np.where(np.isfinite(low), low, median[keep]),
                np.where(np.isfinite(high), high, median[keep]),
            )
            lines.append(label)
            ax.errorbar(
                x,
                median[keep],
                yerr=[median[keep] - low, high - median[keep]],
                color=style.color,
                marker=style.marker,
                linewidth=2,
                capsize=3,
                label=label,
                zorder=3,
            )
            floor = pd.to_numeric(rows["floor"], errors="coerce").to_numpy(dtype=float)
            has_floor = np.isfinite(floor) & (floor > 0)
            if has_floor.any():
                floors.append(label)
                ax.plot(
                    rows["pos"].to_numpy(dtype=float)[has_floor] + offsets[series.index(label)],
                    floor[has_floor],
                    **_floor_marks(style),
                    zorder=2,
                )
        _scale_axis(ax, x_order, unit + " (log)", title)
        handles = [
            Line2D([], [], color=styles[label].color, marker=styles[label].marker, linewidth=2)
            for label in lines
        ]
        labels = list(lines)
        for label in floors:
            handles.append(Line2D([], [], **_floor_marks(styles[label])))
            labels.append(f"{label} launch floor (CUDA graph)")
        legend_right(ax, handles, labels)
    return path


def _layout(series: Sequence[str], x_order: Sequence[str]) -> tuple[dict, dict[str, int], list[float]]:
    """Each series' style, each x category's position, and each series' offset within a category."""
    return (
        arm_styles(series),
        {x: i for i, x in enumerate(x_order)},
        series_offsets(len(series), len(x_order)),
    )


def _ordered(table: pd.DataFrame, label: str, positions: dict[str, int]) -> pd.DataFrame:
    """One series' rows on the x axis, in axis order, with their position ``pos``."""
    rows = table[table["series"] == label]
    return rows[rows["x"].isin(positions)].assign(pos=lambda r: r["x"].map(positions)).sort_values("pos")


def _floor_marks(style: MarkStyle) -> dict[str, object]:
    """A launch floor's line: its series' colour and marker, hollow, dashed."""
    return {
        "color": style.color,
        "linestyle": "--",
        "linewidth": 1.5,
        "marker": style.marker,
        "markerfacecolor": "none",
    }


def _scale_axis(ax: Axes, x_order: Sequence[str], ylabel: str, title: str) -> None:
    """The categorical scale axis, its labels and the title."""
    ax.set_xticks(range(len(x_order)))
    ax.set_xticklabels(list(x_order))
    margin = 0.5 if len(x_order) == 1 else 0.3
    ax.set_xlim(-margin, len(x_order) - 1 + margin)
    ax.set_xlabel("scale")
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def series_offsets(count: int, categories: int) -> list[float]:
    """Horizontal offsets of ``count`` series within one x category."""
    if count <= 1:
        return [0.0] * count
    span = 0.6 if categories <= 1 else 0.3
    return [span * (i / (count - 1) - 0.5) for i in range(count)]


def plot_memory(
    table: pd.DataFrame,
    series: Sequence[str],
    x_order: Sequence[str],
    path: Path,
    title: str = "extra peak memory",
) -> Path:
    """Bytes per series over categorical x (``table`` columns ``x``, ``series``, ``bytes``), in MiB."""
    styles, positions, offsets = _layout(series, x_order)
    values = (
        pd.to_numeric(table["bytes"], errors="coerce").to_numpy(dtype=float) / 2**20
        if len(table)
        else np.array([])
    )
    finite = values[np.isfinite(values)]
    with figure(path, width=10.0, height=5.0) as (fig, ax):
        if len(finite) and finite.min() > 0 and finite.max() / finite.min() >= 20:
            ax.set_yscale("log")
        drawn = False
        for label in series:
            rows = _ordered(table, label, positions)
            mib = pd.to_numeric(rows["bytes"], errors="coerce").to_numpy(dtype=float) / 2**20
            keep = np.isfinite(mib)
            if not keep.any():
                continue
            drawn = True
            style = styles[label]
            ax.plot(
                rows["pos"].to_numpy(dtype=float)[keep] + offsets[series.index(label)],
                mib[keep],
                color=style.color,
                marker=style.marker,
                linewidth=2,
                label=label,
            )
        if not drawn:
            ax.text(
                0.5,
                0.5,
                "no memory figures (CPU run: no CUDA allocator)",
                transform=ax.transAxes,
                ha="center",
                va="center",
            )
            ax.set_yticks([])
        _scale_axis(ax, x_order, "MiB", title)
        if drawn:
            legend_right(ax)
    return path
