"""The house style of every plot: headless (Agg), readable in print, the same bytes for the same inputs."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib import rc_context  # noqa: E402 - after the backend is fixed
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

STYLE: dict[str, Any] = {
    "font.size": 13,
    "axes.titlesize": 14,
    "axes.labelsize": 13,
    "xtick.labelsize": 12,
    "ytick.labelsize": 12,
    "legend.fontsize": 11,
    "axes.grid": True,
    "grid.alpha": 0.35,
    "grid.linestyle": ":",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.markersize": 8,
    "svg.hashsalt": "musgd-bench",
}
DPI = 150
PNG_METADATA = {"Software": None}  # no matplotlib version stamp: same inputs, same PNG bytes

# Okabe–Ito: distinguishable by colour-blind readers; vermillion is kept back for failures.
ARM_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
ARM_MARKERS = ("o", "s", "^", "D", "v", "P", "*")


@dataclass(frozen=True)
class MarkStyle:
    color: str
    marker: str


FAILED = MarkStyle("#D55E00", "x")
WARMUP = MarkStyle("#8C8C8C", "o")
BAR = MarkStyle("#D55E00", "")
INTERVAL_COLOR = "#7F7F7F"


def arm_styles(labels: Sequence[str]) -> dict[str, MarkStyle]:
    """A colour and a marker per arm label, in the given (plan) order, so every plot agrees."""
    return {
        label: MarkStyle(ARM_COLORS[i % len(ARM_COLORS)], ARM_MARKERS[i % len(ARM_MARKERS)])
        for i, label in enumerate(labels)
    }


FAILED_MARKS = {"marker": FAILED.marker, "color": FAILED.color, "markersize": 10, "markeredgewidth": 2.5}


def failure_handle(label: str) -> Line2D:
    """The legend entry of a failure (a red x), the same in every plot."""
    return Line2D([], [], linestyle="", label=label, **FAILED_MARKS)


def legend_right(ax: Axes, *args: Any, **kwargs: Any) -> None:
    """The legend outside the axes, to their right, top-aligned."""
    ax.legend(*args, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **kwargs)


def label_rows(ax: Axes, labels: Sequence[str], top: float = -0.5, bottom: float = 0.5) -> None:
    """One horizontal row per label, the first at the top, without horizontal grid lines."""
    ax.set_ylim(len(labels) - bottom, top)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.grid(axis="y", visible=False)


def marks(style: MarkStyle, hollow: bool = False, size: float = 8.5) -> dict[str, Any]:
    """Marker keywords of one arm's points (``ax.plot(..., linestyle="", **marks(style))``)."""
    face = "none" if hollow else style.color
    edge = WARMUP.color if hollow else style.color
    return {
        "marker": style.marker,
        "markersize": size,
        "markerfacecolor": face,
        "markeredgecolor": edge,
        "markeredgewidth": 1.5,
    }


def marker_handle(style: MarkStyle, label: str, hollow: bool = False) -> Line2D:
    """A legend entry drawn exactly like the points it names (see ``marks``)."""
    return Line2D([], [], linestyle="", label=label, **marks(style, hollow))


def percent_axis(ax: Axes, axis: str = "y", decimals: int = 0) -> None:
    """Show fractions (0.12) as percent (12%) on ``axis`` ('x' or 'y')."""
    formatter = FuncFormatter(lambda v, _pos: f"{100 * v:.{decimals}f}%")
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(formatter)


@contextmanager
def figure(path: Path, width: float = 9.0, height: float = 4.8) -> Iterator[tuple[Figure, Axes]]:
    """``with figure(path) as (fig, ax): ...`` draws under the house style and saves a PNG at the end."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with rc_context(STYLE):
        fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
        ax = fig.add_subplot()
        yield fig, ax
        fig.savefig(path, dpi=DPI, format="png", metadata=PNG_METADATA)


def axis_label(text: str, width: int = 36) -> str:
    """An axis label wrapped onto lines of at most ``width`` characters, so long metrics stay on the page."""
    return textwrap.fill(text, width=width, break_long_words=False)
