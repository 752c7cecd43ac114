"""The screen's plots: the crossover (ms/step against scale, floors dashed) and the extra peak memory."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from harness.plots import MarkStyle, arm_styles, figure, legend_right

CROSSOVER_PNG = "screen_crossover.png"
MEMORY_PNG = "screen_memory.png"


def series_offsets(count: int, categories: int) -> list[float]:
    """Horizontal offsets of ``count`` series within one x category."""
    if count <= 1:
        return [0.0] * count
    span = 0.6 if categories <= 1 else 0.3
    return [span * (i / (count - 1) - 0.5) for i in range(count)]


def _series(
    table: pd.DataFrame, series: Sequence[str], x_order: Sequence[str], columns: Sequence[str]
) -> Iterator[tuple[str, MarkStyle, np.ndarray, np.ndarray]]:
    """Per series in order: its style, its x positions (apart within a category) and its ``columns`` as floats."""
    styles = arm_styles(series)
    positions = {x: i for i, x in enumerate(x_order)}
    for label, offset in zip(series, series_offsets(len(series), len(x_order)), strict=True):
        rows = table[table["series"] == label]
        rows = rows[rows["x"].isin(positions)].assign(pos=lambda r: r["x"].map(positions)).sort_values("pos")
        figures = rows[list(columns)].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        yield label, styles[label], rows["pos"].to_numpy(dtype=float) + offset, figures.T


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


def plot_crossover(
    table: pd.DataFrame,
    series: Sequence[str],
    x_order: Sequence[str],
    path: Path,
    title: str = "crossover",
    unit: str = "ms/step",
) -> Path:
    """A crossover plot (the screen's): one line per series over categorical x, log y."""
    handles: list[Line2D] = []  # each series drawn, then each floor, drawn as what it names
    labels: list[str] = []
    floors: list[tuple[str, MarkStyle]] = []
    with figure(path, width=10.0, height=5.4) as (fig, ax):
        ax.set_yscale("log")
        for label, style, x, (median, low, high, floor) in _series(
            table, series, x_order, ["median", "low", "high", "floor"]
        ):
            keep = np.isfinite(median) & (median > 0)
            if not keep.any():
                continue
            mid, low, high = median[keep], low[keep], high[keep]
            low, high = np.where(np.isfinite(low), low, mid), np.where(np.isfinite(high), high, mid)
            ax.errorbar(
                x[keep],
                mid,
                yerr=[mid - low, high - mid],
                color=style.color,
                marker=style.marker,
                linewidth=2,
                capsize=3,
                label=label,
                zorder=3,
            )
            handles.append(Line2D([], [], color=style.color, marker=style.marker, linewidth=2))
            labels.append(label)
            has_floor = np.isfinite(floor) & (floor > 0)
            if has_floor.any():
                floors.append((label, style))
                ax.plot(x[has_floor], floor[has_floor], **_floor_marks(style), zorder=2)
        _scale_axis(ax, x_order, unit + " (log)", title)
        handles += [Line2D([], [], **_floor_marks(style)) for _, style in floors]
        labels += [f"{label} launch floor (CUDA graph)" for label, _ in floors]
        legend_right(ax, handles, labels)
    return path


def plot_memory(
    table: pd.DataFrame,
    series: Sequence[str],
    x_order: Sequence[str],
    path: Path,
    title: str = "extra peak memory",
) -> Path:
    """Bytes per series over categorical x (``table`` columns ``x``, ``series``, ``bytes``), in MiB."""
    raw = table["bytes"] if len(table) else pd.Series(dtype=float)
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float) / 2**20
    finite = values[np.isfinite(values)]
    with figure(path, width=10.0, height=5.0) as (fig, ax):
        if len(finite) and finite.min() > 0 and finite.max() / finite.min() >= 20:
            ax.set_yscale("log")
        drawn = False
        for label, style, x, (raw,) in _series(table, series, x_order, ["bytes"]):
            mib = raw / 2**20
            keep = np.isfinite(mib)
            if keep.any():
                drawn = True
                ax.plot(x[keep], mib[keep], color=style.color, marker=style.marker, linewidth=2, label=label)
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
