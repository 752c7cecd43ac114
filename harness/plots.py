"""The report's own plots of a run: the timeline, the paired reductions and the telemetry."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402 - after the backend is fixed
import pandas as pd  # noqa: E402
from matplotlib import rc_context  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from harness.formatting import format_percent  # noqa: E402
from harness.plot_style import (  # noqa: E402
    ARM_COLORS,
    BAR,
    DPI,
    FAILED,
    FAILED_MARKS,
    INTERVAL_COLOR,
    PNG_METADATA,
    STYLE,
    MarkStyle,
    arm_styles,
    axis_label,
    failure_handle,
    figure,
    label_rows,
    legend_right,
    marker_handle,
    marks,
    percent_axis,
)


def _spans(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous runs [first, last] of sorted integers."""
    ordered = np.sort(np.asarray(indices, dtype=int))
    runs = np.split(ordered, np.flatnonzero(np.diff(ordered) != 1) + 1) if len(ordered) else []
    return [(int(run[0]), int(run[-1])) for run in runs]


def plot_timeline(trials: pd.DataFrame, plan: Any, path: Path) -> Path:
    """Every trial's figure in schedule order."""
    styles = arm_styles(plan.arm_labels())
    scheduled = len(plan.schedule)
    rows = _timeline_rows(trials)
    ok = (rows["status"] == "ok") & rows["value"].notna()
    finite = rows.loc[ok, "value"]
    width = min(16.0, max(10.0, 6.0 + 0.03 * scheduled))
    with figure(path, width=width, height=5.0) as (fig, ax):
        positive = finite[finite > 0]
        if len(positive) and positive.max() / positive.min() >= 20:
            ax.set_yscale("log")
        drawn: list[tuple[str, str]] = []  # (arm, phase) in drawing order: what the legend names
        for label, style in styles.items():
            for phase in ("warmup", "measured"):
                mask = ok & (rows["arm"] == label) & (rows["phase"] == phase)
                if not mask.any():
                    continue
                x, y = (
                    rows.loc[mask, "index"].to_numpy(dtype=float),
                    rows.loc[mask, "value"].to_numpy(dtype=float),
                )
                ax.plot(x, y, linestyle="", zorder=3, **marks(style, hollow=phase == "warmup"))
                drawn.append((label, phase))
        failed = rows[rows["status"] != "ok"]
        if len(failed):
            ax.plot(
                [0, 1],
                [0.96, 0.96],
                transform=ax.transAxes,
                color=FAILED.color,
                linestyle=":",
                linewidth=1,
                alpha=0.6,
                zorder=1,
            )
            ax.plot(
                failed["index"].to_numpy(dtype=float),
                np.full(len(failed), 0.96),
                linestyle="",
                **FAILED_MARKS,
                transform=ax.get_xaxis_transform(),
                zorder=4,
                clip_on=False,
            )
        done = {int(i) for i in rows["index"]}
        missing = [i for i in range(scheduled) if i not in done]
        for first, last in _spans(missing):
            ax.axvspan(
                first - 0.5,
                last + 0.5,
                facecolor="#DDDDDD",
                edgecolor="#AAAAAA",
                alpha=0.6,
                hatch="//",
                linewidth=0,
                zorder=0,
            )
        if len(failed) and len(finite):
            _headroom(ax, 0.14)  # the failures' row sits above every measured point
        _case_dividers(ax, plan)
        ax.set_xlim(-0.7, max(scheduled, 1) - 0.3)
        if len(finite) == 0:
            ax.set_yticks([])
        ax.set_xlabel("trial (schedule order)")
        ax.set_ylabel(axis_label(f"{plan.metric} ({plan.unit})"))
        ax.set_title(f"{plan.tier}: every trial in schedule order", pad=_case_label_height(plan))
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
            handles.append(failure_handle("failed (counts as ∞)"))
        if missing:
            handles.append(
                Patch(facecolor="#DDDDDD", edgecolor="#AAAAAA", hatch="//", label="scheduled, not run")
            )
        legend_right(ax, handles=handles)
    return path


def _timeline_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """index, case, arm, phase, status and value (float; NaN where failed) of every logged trial."""
    columns = ["index", "case", "arm", "phase", "status", "value"]
    if trials.empty:
        return pd.DataFrame(
            {c: pd.Series(dtype=float if c in ("index", "value") else object) for c in columns}
        )
    rows = trials.reindex(columns=columns).copy()
    rows["value"] = pd.to_numeric(rows["value"], errors="coerce").astype(float)
    return rows


def _headroom(ax: Axes, fraction: float) -> None:
    """Raise the top of the y axis by ``fraction`` of its span (in log space on a log axis)."""
    low, high = ax.get_ylim()
    if ax.get_yscale() == "log":
        ax.set_ylim(low, high * (high / low) ** fraction)
    else:
        ax.set_ylim(low, high + fraction * (high - low))


def _case_dividers(ax: Axes, plan: Any) -> None:
    """Dotted lines between cases in the schedule, with each case's label along the top."""
    if len(plan.cases) < 2:
        return
    firsts: dict[str, int] = {}
    lasts: dict[str, int] = {}
    for trial in plan.schedule:
        firsts.setdefault(trial.case, trial.index)
        lasts[trial.case] = trial.index
    for case in plan.cases:
        if case.label not in firsts:
            continue
        start, end = firsts[case.label], lasts[case.label]
        if start > 0:
            ax.axvline(start - 0.5, color="#555555", linestyle=":", linewidth=1.2)
        ax.text(
            (start + end) / 2,
            1.01,
            case.label,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=CASE_LABEL_SIZE,
            rotation=90 if len(plan.cases) > FLAT_CASE_LABELS else 0,
        )


CASE_LABEL_SIZE = 10
FLAT_CASE_LABELS = 6  # more cases than this: their labels stand upright so they cannot collide


def _case_label_height(plan: Any) -> float:
    """Title padding (points) that clears the case labels drawn above the axes."""
    if len(plan.cases) < 2:
        return 8.0
    if len(plan.cases) <= FLAT_CASE_LABELS:
        return 8.0 + 1.6 * CASE_LABEL_SIZE
    longest = max(len(c.label) for c in plan.cases)
    return 12.0 + 0.65 * CASE_LABEL_SIZE * longest


EXTREME_FENCE = 3.0  # a pair beyond quartile ± 3 × IQR of its plot's reductions is an outlier candidate ...
SQUASH = 4.0  # ... and the axis is clipped to the bulk only when the full span is over 4 × the bulk's


def reduction_axis(values: np.ndarray, keep: Sequence[float]) -> tuple[float, float, bool]:
    """(left, right, clipped): the x span of a reductions plot, keeping to the bulk past an extreme pair."""
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
    return left - pad, right + pad, clipped


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


def plot_reductions(pairs: pd.DataFrame, claims: pd.DataFrame, plan: Any, path: Path) -> Path:
    """Paired reductions per case and arm."""
    keys = [(str(c["case"]), str(c["arm"])) for _, c in claims.iterrows()]
    styles = arm_styles(plan.arm_labels())
    height = min(20.0, max(3.2, 1.4 + (0.75 if len(keys) <= 10 else 0.45) * len(keys)))
    with figure(path, width=10.0, height=height) as (fig, ax):
        values_all = pairs["reduction"].to_numpy(dtype=float) if not pairs.empty else np.array([])
        # The bar's dashed line(s): a claim's bar, or an A/A control's tolerance at ±bar.
        lines = (
            []
            if plan.protocol.bar is None
            else (
                [-plan.protocol.bar / 100, plan.protocol.bar / 100]
                if plan.protocol.control
                else [plan.protocol.bar / 100]
            )
        )
        medians = claims["median"].to_numpy(dtype=float) if not claims.empty else np.array([])
        lows = claims["ci_low"].to_numpy(dtype=float) if not claims.empty else np.array([])
        highs = claims["ci_high"].to_numpy(dtype=float) if not claims.empty else np.array([])
        interval_ends = [v for v in (*lows, *highs) if math.isfinite(v)]
        left, right, clipped = reduction_axis(values_all, [*medians, *lines])
        if not clipped:  # the intervals fit too, unless the axis keeps to the bulk
            ends = np.array(interval_ends + [left, right])
            pad = max(0.02, 0.08 * (float(ends.max()) - float(ends.min())))
            left = min(left, float(ends.min()) - pad) if interval_ends else left
            right = max(right, float(ends.max()) + pad) if interval_ends else right
        failed_x = left + 0.03 * (right - left)
        any_failed, any_beyond = False, False
        shown: list[str] = []
        for y, (case, arm) in enumerate(keys):
            style = styles.get(arm, MarkStyle(ARM_COLORS[0], "o"))
            mine = pairs[(pairs["case"].astype(str) == case) & (pairs["arm"].astype(str) == arm)]
            values = mine["reduction"].to_numpy(dtype=float)
            rounds = mine["round"].to_numpy(dtype=int)
            # A fixed vertical offset per round (not random jitter) keeps overlapping points apart.
            offsets = 0.07 * ((rounds % 5) - 2)
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
                ax.plot(
                    np.full(int(lost.sum()), failed_x),
                    y + offsets[lost],
                    linestyle="",
                    **FAILED_MARKS,
                    zorder=4,
                )
            claim = claims.iloc[y]
            low, high, median = float(claim["ci_low"]), float(claim["ci_high"]), float(claim["median"])
            if not (math.isnan(low) or math.isnan(high)):
                ax.plot(
                    [min(max(low, left), right), max(min(high, right), left)],
                    [y + 0.3, y + 0.3],
                    color=INTERVAL_COLOR,
                    linewidth=5,
                    solid_capstyle="butt",
                    zorder=2,
                )
                for end, edge, marker in ((low, left, "<"), (high, right, ">")):
                    beyond_edge = end < edge if marker == "<" else end > edge
                    if beyond_edge:  # the interval runs past the axis (to ±∞ or to an extreme pair)
                        ax.plot(
                            [edge],
                            [y + 0.3],
                            linestyle="",
                            marker=marker,
                            color=INTERVAL_COLOR,
                            markersize=9,
                            zorder=2,
                            clip_on=False,
                        )
            if math.isfinite(median) and left <= median <= right:
                ax.plot([median, median], [y - 0.25, y + 0.38], color="#000000", linewidth=3, zorder=4)
        for line in lines:
            ax.axvline(line, color=BAR.color, linestyle="--", linewidth=2)
        ax.axvline(0.0, color="#555555", linewidth=1)
        ax.set_xlim(left, right)
        names = [f"{case} · {arm}" if len(plan.cases) > 1 else arm for case, arm in keys]
        label_rows(ax, names, top=-0.55, bottom=0.45)
        percent_axis(ax, "x", decimals=1 if right - left < 0.2 else 0)
        ax.set_xlabel("paired reduction (baseline − arm) / baseline   (higher is faster)")
        level = float(claims["ci_level"].iloc[0]) if not claims.empty else 0.95
        ax.set_title(f"{plan.tier}: paired reductions of {plan.metric}")
        handles = [
            marker_handle(styles.get(arm, MarkStyle(ARM_COLORS[0], "o")), f"one pair ({arm})")
            for arm in shown
        ]
        handles += [
            Line2D([], [], color="#000000", linewidth=3, label="median"),
            Line2D([], [], color=INTERVAL_COLOR, linewidth=5, label=f"{100 * level:.0f}% primary interval"),
        ]
        if lines:
            label = (
                f"tolerance ±{plan.protocol.bar:g}%"
                if plan.protocol.control
                else f"bar {plan.protocol.bar:g}%"
            )
            handles.append(Line2D([], [], color=BAR.color, linestyle="--", linewidth=2, label=label))
        if any_beyond:
            handles.append(
                Line2D(
                    [],
                    [],
                    color="#555555",
                    linewidth=1.2,
                    label="beyond the axis: at its edge, value labelled",
                )
            )
        if any_failed:
            handles.append(failure_handle("arm failed (−∞)"))
        legend_right(ax, handles=handles)
    return path


def plot_telemetry(trials: pd.DataFrame, plan: Any, columns: Sequence[tuple[str, str]], path: Path) -> Path:
    """One small panel per telemetry column."""
    styles = arm_styles(plan.arm_labels())
    rows = trials[trials["status"] == "ok"] if "status" in trials else trials
    count = len(columns)
    cols = min(3, count)
    height_rows = (count + cols - 1) // cols
    with rc_context(STYLE):
        fig = Figure(figsize=(4.2 * cols + 1.5, 3.4 * height_rows), dpi=DPI, layout="constrained")
        axes = fig.subplots(height_rows, cols, squeeze=False)
        for k, (column, label) in enumerate(columns):
            ax = axes[k // cols][k % cols]
            for arm, style in styles.items():
                for phase in ("measured", "warmup"):
                    mine = rows[(rows["arm"] == arm) & (rows["phase"] == phase)]
                    x = pd.to_numeric(mine[column], errors="coerce").to_numpy(dtype=float)
                    y = pd.to_numeric(mine["value"], errors="coerce").to_numpy(dtype=float)
                    keep = np.isfinite(x) & np.isfinite(y)
                    if not keep.any():
                        continue
                    if phase == "measured":
                        ax.scatter(x[keep], y[keep], marker=style.marker, color=style.color, s=40, zorder=3)
                    else:
                        ax.scatter(
                            x[keep],
                            y[keep],
                            marker=style.marker,
                            facecolors="none",
                            edgecolors=style.color,
                            s=40,
                            zorder=3,
                        )
            ax.set_xlabel(axis_label(label, 30))
            ax.set_ylabel(axis_label(f"{plan.metric} ({plan.unit})", 24))
        for k in range(count, height_rows * cols):
            axes[k // cols][k % cols].set_visible(False)
        handles = [
            Line2D([], [], linestyle="", marker=s.marker, color=s.color, markersize=8, label=label)
            for label, s in styles.items()
        ]
        fig.legend(handles=handles, loc="outside right upper", frameon=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=DPI, format="png", metadata=PNG_METADATA)
    return path
