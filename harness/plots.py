"""Every plot's house style (headless, readable in print, same bytes for same inputs) and the report's plots."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402 - after the backend is fixed
import pandas as pd  # noqa: E402
from matplotlib import rc_context  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from harness.formatting import format_percent  # noqa: E402

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
FAILED_COLOR = "#D55E00"
WARMUP_COLOR = "#8C8C8C"
INTERVAL_COLOR = "#7F7F7F"

# How each recurring element is drawn: an element and its legend entry take the same keywords.
LOOK: dict[str, dict[str, Any]] = {
    "failed": {
        "linestyle": "",
        "marker": "x",
        "color": FAILED_COLOR,
        "markersize": 10,
        "markeredgewidth": 2.5,
    },
    "bar": {"color": FAILED_COLOR, "linestyle": "--", "linewidth": 2},
    "missing": {"facecolor": "#DDDDDD", "edgecolor": "#AAAAAA", "hatch": "//"},
    "median": {"color": "#000000", "linewidth": 3},
    "interval": {"color": INTERVAL_COLOR, "linewidth": 5},
}


class MarkStyle(NamedTuple):
    """One arm's colour and marker."""

    color: str
    marker: str


def arm_styles(labels: Sequence[str]) -> dict[str, MarkStyle]:
    """A colour and a marker per arm label, in the given (plan) order, so every plot agrees."""
    return {
        label: MarkStyle(ARM_COLORS[i % len(ARM_COLORS)], ARM_MARKERS[i % len(ARM_MARKERS)])
        for i, label in enumerate(labels)
    }


def marks(style: MarkStyle, hollow: bool = False) -> dict[str, Any]:
    """Marker keywords of one arm's points (``ax.plot(..., linestyle="", **marks(style))``)."""
    return {
        "marker": style.marker,
        "markersize": 8.5,
        "markerfacecolor": "none" if hollow else style.color,
        "markeredgecolor": WARMUP_COLOR if hollow else style.color,
        "markeredgewidth": 1.5,
    }


def marker_handle(style: MarkStyle, label: str, hollow: bool = False) -> Line2D:
    """A legend entry drawn exactly like the points it names (see ``marks``)."""
    return Line2D([], [], linestyle="", label=label, **marks(style, hollow))


def legend_right(ax: Axes, *args: Any, **kwargs: Any) -> None:
    """The legend outside the axes, to their right, top-aligned."""
    ax.legend(*args, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **kwargs)


def label_rows(ax: Axes, labels: Sequence[str], top: float = -0.5, bottom: float = 0.5) -> None:
    """One horizontal row per label, the first at the top, without horizontal grid lines."""
    ax.set_ylim(len(labels) - bottom, top)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.grid(axis="y", visible=False)


def axis_label(text: str, width: int = 36) -> str:
    """An axis label wrapped onto lines of at most ``width`` characters, so long metrics stay on the page."""
    return textwrap.fill(text, width=width, break_long_words=False)


@contextmanager
def figure(
    path: Path, width: float = 9.0, height: float = 4.8, panels: tuple[int, int] | None = None
) -> Iterator[tuple[Figure, Any]]:
    """``with figure(path) as (fig, ax)``: drawn in the house style, saved as a PNG (``panels``: a grid of axes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with rc_context(STYLE):
        fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
        yield fig, fig.add_subplot() if panels is None else fig.subplots(*panels, squeeze=False)
        fig.savefig(path, dpi=DPI, format="png", metadata=PNG_METADATA)


def plot_timeline(trials: pd.DataFrame, plan: Any, path: Path) -> Path:
    """Every trial's figure in schedule order."""
    styles = arm_styles(plan.arm_labels())
    scheduled = len(plan.schedule)
    rows = trials.reindex(columns=["index", "case", "arm", "phase", "status", "value"])
    rows["value"] = pd.to_numeric(rows["value"], errors="coerce").astype(float)
    ok = (rows["status"] == "ok") & rows["value"].notna()
    finite = rows.loc[ok, "value"]
    failed = rows[rows["status"] != "ok"]
    missing = sorted(set(range(scheduled)) - {int(i) for i in rows["index"]})
    with figure(path, width=min(16.0, max(10.0, 6.0 + 0.03 * scheduled)), height=5.0) as (fig, ax):
        positive = finite[finite > 0]
        if len(positive) and positive.max() / positive.min() >= 20:
            ax.set_yscale("log")
        drawn: list[tuple[str, str]] = []  # (arm, phase) in drawing order: what the legend names
        for label, style in styles.items():
            for phase in ("warmup", "measured"):
                mask = ok & (rows["arm"] == label) & (rows["phase"] == phase)
                if mask.any():
                    x, y = rows.loc[mask, ["index", "value"]].to_numpy(dtype=float).T
                    ax.plot(x, y, linestyle="", zorder=3, **marks(style, hollow=phase == "warmup"))
                    drawn.append((label, phase))
        handles = [
            marker_handle(styles[label], f"{label} (measured)")
            for label in styles
            if (label, "measured") in drawn or (label, "warmup") not in drawn
        ]
        handles += [
            marker_handle(styles[label], f"{label} warm-up (discarded)", hollow=True)
            for label in styles
            if (label, "warmup") in drawn
        ]
        if len(failed):
            ax.plot(
                [0, 1],
                [0.96, 0.96],
                transform=ax.transAxes,
                color=FAILED_COLOR,
                linestyle=":",
                linewidth=1,
                alpha=0.6,
                zorder=1,
            )
            ax.plot(
                failed["index"].to_numpy(dtype=float),
                np.full(len(failed), 0.96),
                **LOOK["failed"],
                transform=ax.get_xaxis_transform(),
                zorder=4,
                clip_on=False,
            )
            handles.append(Line2D([], [], label="failed (counts as ∞)", **LOOK["failed"]))
        for first, last in _spans(missing):
            ax.axvspan(first - 0.5, last + 0.5, alpha=0.6, linewidth=0, zorder=0, **LOOK["missing"])
        if missing:
            handles.append(Patch(label="scheduled, not run", **LOOK["missing"]))
        if len(failed) and len(finite):
            _headroom(ax, 0.14)  # the failures' row sits above every measured point
        _case_dividers(ax, plan)
        ax.set_xlim(-0.7, max(scheduled, 1) - 0.3)
        if len(finite) == 0:
            ax.set_yticks([])
        ax.set_xlabel("trial (schedule order)")
        ax.set_ylabel(axis_label(f"{plan.metric} ({plan.unit})"))
        ax.set_title(f"{plan.tier}: every trial in schedule order", pad=_case_label_height(plan))
        legend_right(ax, handles=handles)
    return path


def _spans(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous runs [first, last] of sorted integers."""
    ordered = np.asarray(indices, dtype=int)
    runs = np.split(ordered, np.flatnonzero(np.diff(ordered) != 1) + 1) if len(ordered) else []
    return [(int(run[0]), int(run[-1])) for run in runs]


def _headroom(ax: Axes, fraction: float) -> None:
    """Raise the top of the y axis by ``fraction`` of its span (in log space on a log axis)."""
    low, high = ax.get_ylim()
    if ax.get_yscale() == "log":
        ax.set_ylim(low, high * (high / low) ** fraction)
    else:
        ax.set_ylim(low, high + fraction * (high - low))


CASE_LABEL_SIZE = 10
FLAT_CASE_LABELS = 6  # more cases than this: their labels stand upright so they cannot collide


def _case_dividers(ax: Axes, plan: Any) -> None:
    """Dotted lines between cases in the schedule, with each case's label along the top."""
    if len(plan.cases) < 2:
        return
    slots = pd.DataFrame([(t.case, t.index) for t in plan.schedule], columns=["case", "index"])
    spans = slots.groupby("case")["index"].agg(["first", "last"])
    for label in [case.label for case in plan.cases if case.label in spans.index]:
        start, end = (int(i) for i in spans.loc[label])
        if start > 0:
            ax.axvline(start - 0.5, color="#555555", linestyle=":", linewidth=1.2)
        ax.text(
            (start + end) / 2,
            1.01,
            label,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=CASE_LABEL_SIZE,
            rotation=90 if len(plan.cases) > FLAT_CASE_LABELS else 0,
        )


def _case_label_height(plan: Any) -> float:
    """Title padding (points) that clears the case labels drawn above the axes."""
    if len(plan.cases) < 2:
        return 8.0
    if len(plan.cases) <= FLAT_CASE_LABELS:
        return 8.0 + 1.6 * CASE_LABEL_SIZE
    return 12.0 + 0.65 * CASE_LABEL_SIZE * max(len(c.label) for c in plan.cases)


EXTREME_FENCE = 3.0  # a pair beyond quartile ± 3 × IQR of its plot's reductions is an outlier candidate ...
SQUASH = 4.0  # ... and the axis is clipped to the bulk only when the full span is over 4 × the bulk's


def reduction_axis(
    values: np.ndarray, keep: Sequence[float], ends: Sequence[float] = ()
) -> tuple[float, float, bool]:
    """(left, right, clipped): the reductions' x span past ``keep``, and ``ends`` unless it keeps to the bulk."""
    finite = values[np.isfinite(values)]
    anchors = [float(v) for v in keep if math.isfinite(v)] + [0.0]
    everything = np.concatenate([finite, anchors])
    left, right = float(everything.min()), float(everything.max())
    clipped = False
    if len(finite) >= 4:
        q1, q3 = np.percentile(finite, [25, 75])
        spread = q3 - q1
        bulk = finite[(finite >= q1 - EXTREME_FENCE * spread) & (finite <= q3 + EXTREME_FENCE * spread)]
        inner = np.concatenate([bulk, anchors])
        low, high = float(inner.min()), float(inner.max())
        if high > low and (right - left) > SQUASH * (high - low):
            left, right, clipped = low, high, True
    pad = max(0.02, 0.08 * (right - left))
    left, right = left - pad, right + pad
    ends = [v for v in ends if math.isfinite(v)]
    if clipped or not ends:
        return left, right, clipped
    pad = max(0.02, 0.08 * (max(ends + [right]) - min(ends + [left])))
    return min(left, min(ends + [left]) - pad), max(right, max(ends + [right]) + pad), clipped


def _beyond(ax: Axes, x: float, y: float, value: float, style: MarkStyle, left_edge: bool) -> None:
    """An outlier drawn at the axis edge in its arm's marker, arrowed and labelled with its value."""
    ax.plot([x], [y], linestyle="", zorder=5, clip_on=False, **marks(style))
    ax.annotate(
        f"← {format_percent(value)}" if left_edge else f"{format_percent(value)} →",
        xy=(x, y),
        xytext=(9 if left_edge else -9, 0),
        textcoords="offset points",
        ha="left" if left_edge else "right",
        va="center",
        fontsize=10,
        color=style.color,
        annotation_clip=False,
    )


def _interval(ax: Axes, y: float, low: float, high: float, left: float, right: float) -> None:
    """A claim's interval as a grey band, an arrowhead at each axis edge it runs past."""
    span = [min(max(low, left), right), max(min(high, right), left)]
    ax.plot(span, [y, y], **LOOK["interval"], solid_capstyle="butt", zorder=2)
    for beyond, edge, marker in ((low < left, left, "<"), (high > right, right, ">")):
        if beyond:  # the interval runs past the axis (to ±∞ or to an extreme pair)
            ax.plot(
                [edge],
                [y],
                linestyle="",
                marker=marker,
                color=INTERVAL_COLOR,
                markersize=9,
                zorder=2,
                clip_on=False,
            )


def plot_reductions(pairs: pd.DataFrame, claims: pd.DataFrame, plan: Any, path: Path) -> Path:
    """Paired reductions per case and arm."""
    keys = [(str(c["case"]), str(c["arm"])) for _, c in claims.iterrows()]
    styles = arm_styles(plan.arm_labels())
    bar, control = plan.protocol.bar, plan.protocol.control
    # The bar's dashed line(s): a claim's bar, or an A/A control's tolerance at ±bar.
    lines = [] if bar is None else [-bar / 100, bar / 100] if control else [bar / 100]
    ci = claims.reindex(columns=["median", "ci_low", "ci_high"]).to_numpy(dtype=float)
    values_all = pairs["reduction"].to_numpy(dtype=float) if not pairs.empty else np.array([])
    left, right, _ = reduction_axis(values_all, [*ci[:, 0], *lines], [*ci[:, 1], *ci[:, 2]])
    failed_x = left + 0.03 * (right - left)
    height = min(20.0, max(3.2, 1.4 + (0.75 if len(keys) <= 10 else 0.45) * len(keys)))
    with figure(path, width=10.0, height=height) as (fig, ax):
        any_failed, any_beyond = False, False
        shown: list[str] = []
        for y, ((case, arm), (median, low, high)) in enumerate(zip(keys, ci, strict=True)):
            style = styles.get(arm, MarkStyle(ARM_COLORS[0], "o"))
            mine = pairs[(pairs["case"].astype(str) == case) & (pairs["arm"].astype(str) == arm)]
            values = mine["reduction"].to_numpy(dtype=float)
            # A fixed vertical offset per round (not random jitter) keeps overlapping points apart.
            offsets = 0.07 * ((mine["round"].to_numpy(dtype=int) % 5) - 2)
            fin = np.isfinite(values)
            inside = fin & (values >= left) & (values <= right)
            if inside.any():
                ax.plot(
                    values[inside], y + offsets[inside], linestyle="", alpha=0.9, zorder=3, **marks(style)
                )
            if fin.any() and arm not in shown:
                shown.append(arm)
            for value, offset in zip(values[fin & ~inside], offsets[fin & ~inside], strict=True):
                any_beyond = True
                _beyond(ax, left if value < left else right, y + offset, value, style, value < left)
            lost = np.isinf(values)  # an arm failed; NaN (both failed) is no evidence and not drawn
            if lost.any():
                any_failed = True
                ax.plot(np.full(int(lost.sum()), failed_x), y + offsets[lost], **LOOK["failed"], zorder=4)
            if not (math.isnan(low) or math.isnan(high)):
                _interval(ax, y + 0.3, low, high, left, right)
            if math.isfinite(median) and left <= median <= right:
                ax.plot([median, median], [y - 0.25, y + 0.38], **LOOK["median"], zorder=4)
        for line in lines:
            ax.axvline(line, **LOOK["bar"])
        ax.axvline(0.0, color="#555555", linewidth=1)
        ax.set_xlim(left, right)
        names = [f"{case} · {arm}" if len(plan.cases) > 1 else arm for case, arm in keys]
        label_rows(ax, names, top=-0.55, bottom=0.45)
        decimals = 1 if right - left < 0.2 else 0
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{100 * v:.{decimals}f}%"))
        ax.set_xlabel("paired reduction (baseline − arm) / baseline   (higher is faster)")
        ax.set_title(f"{plan.tier}: paired reductions of {plan.metric}")
        level = float(claims["ci_level"].iloc[0]) if not claims.empty else 0.95
        handles = [
            marker_handle(styles.get(arm, MarkStyle(ARM_COLORS[0], "o")), f"one pair ({arm})")
            for arm in shown
        ]
        handles += [
            Line2D([], [], label="median", **LOOK["median"]),
            Line2D([], [], label=f"{100 * level:.0f}% primary interval", **LOOK["interval"]),
        ]
        if lines:
            label = f"tolerance ±{bar:g}%" if control else f"bar {bar:g}%"
            handles.append(Line2D([], [], label=label, **LOOK["bar"]))
        if any_beyond:
            beyond = "beyond the axis: at its edge, value labelled"
            handles.append(Line2D([], [], color="#555555", linewidth=1.2, label=beyond))
        if any_failed:
            handles.append(Line2D([], [], label="arm failed (−∞)", **LOOK["failed"]))
        legend_right(ax, handles=handles)
    return path


def plot_telemetry(trials: pd.DataFrame, plan: Any, columns: Sequence[tuple[str, str]], path: Path) -> Path:
    """One small panel per telemetry column."""
    styles = arm_styles(plan.arm_labels())
    rows = trials[trials["status"] == "ok"] if "status" in trials else trials
    cols = min(3, len(columns))
    grid = ((len(columns) + cols - 1) // cols, cols)
    with figure(path, 4.2 * cols + 1.5, 3.4 * grid[0], panels=grid) as (fig, axes):
        for k, (column, label) in enumerate(columns):
            ax = axes[k // cols][k % cols]
            for arm, style in styles.items():
                for phase in ("measured", "warmup"):
                    mine = rows[(rows["arm"] == arm) & (rows["phase"] == phase)]
                    x = pd.to_numeric(mine[column], errors="coerce").to_numpy(dtype=float)
                    y = pd.to_numeric(mine["value"], errors="coerce").to_numpy(dtype=float)
                    keep = np.isfinite(x) & np.isfinite(y)
                    if keep.any():
                        look = (
                            {"color": style.color}
                            if phase == "measured"
                            else {"facecolors": "none", "edgecolors": style.color}
                        )
                        ax.scatter(x[keep], y[keep], marker=style.marker, s=40, zorder=3, **look)
            ax.set_xlabel(axis_label(label, 30))
            ax.set_ylabel(axis_label(f"{plan.metric} ({plan.unit})", 24))
        for k in range(len(columns), grid[0] * cols):
            axes[k // cols][k % cols].set_visible(False)
        handles = [
            Line2D([], [], linestyle="", marker=s.marker, color=s.color, markersize=8, label=label)
            for label, s in styles.items()
        ]
        fig.legend(handles=handles, loc="outside right upper", frameon=False)
    return path
