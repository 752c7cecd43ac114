"""The probe's plots: peak memory against the budget, and the head's share of one learner step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.plots import ARM_COLORS, LOOK, MarkStyle, arm_styles, figure, label_rows, legend_right

WHISKER = {"color": "#000000", "linewidth": 1.5}  # the highest peak, past the median's bar
RESERVE = {"edgecolor": "#FFFFFF", "hatch": "//"}  # the reserve held for the rest of the learner
REST_COLOR = "#D9D9D9"  # the learner step but the head


def plot_probe_memory(memory: pd.DataFrame, plan: Any, path: Path) -> Path:
    """Probe: median peak allocated per case and arm, the reserve hatched, the budget dashed."""
    styles = arm_styles(plan.arm_labels())
    gib = float(2**30)
    budget = plan.protocol.budget / gib if plan.protocol.budget is not None else None
    reserve = (plan.settings.get("reserve_bytes") or 0) / gib
    columns = ["peak_allocated_median", "peak_allocated_max"]
    peaks = memory[columns].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float) / gib
    right = max([v for v in peaks[:, 1] if np.isfinite(v)] + [budget or 0.0, reserve, 1e-3]) * 1.12
    out_of_memory = [bool(int(n)) for n in memory["out_of_memory"]]
    with figure(path, width=10.0, height=max(3.2, 1.2 + 0.6 * len(memory))) as (fig, ax):
        for y, ((median, top), arm) in enumerate(zip(peaks, memory["arm"], strict=True)):
            style = styles.get(str(arm), MarkStyle(ARM_COLORS[0], "o"))
            if np.isfinite(median):
                ax.barh(y, median, color=style.color, height=0.6, zorder=2)
                if reserve:
                    ax.barh(
                        y,
                        min(reserve, median),
                        facecolor="none",
                        height=0.6,
                        linewidth=0,
                        zorder=3,
                        **RESERVE,
                    )
                if np.isfinite(top) and top > median:
                    ax.plot([median, top], [y, y], **WHISKER, zorder=4)
                    ax.plot([top, top], [y - 0.15, y + 0.15], **WHISKER, zorder=4)
            if out_of_memory[y]:
                ax.scatter(
                    [budget if budget is not None else right / 1.12],
                    [y],
                    marker=LOOK["failed"]["marker"],
                    color=LOOK["failed"]["color"],
                    s=140,
                    linewidths=3,
                    zorder=5,
                    clip_on=False,
                )
        if budget is not None:
            ax.axvline(budget, **LOOK["bar"])
        ax.set_xlim(0, right)
        label_rows(ax, [f"{r['case']} · {r['arm']}" for _, r in memory.iterrows()])
        ax.set_xlabel("peak allocated (GiB)")
        ax.set_title(f"{plan.tier}: peak memory of one head step")
        handles: list[Any] = [
            Patch(facecolor=s.color, label=f"{label} (median)") for label, s in styles.items()
        ]
        handles.append(Line2D([], [], label="highest peak", **WHISKER))
        if reserve:
            handles.append(Patch(facecolor="#999999", label="--reserve (rest of learner)", **RESERVE))
        if budget is not None:
            handles.append(Line2D([], [], label="budget", **LOOK["bar"]))
        if any(out_of_memory):
            handles.append(Line2D([], [], label="out of memory", **LOOK["failed"]))
        legend_right(ax, handles=handles)
    return path


def plot_stage_share(shares: pd.DataFrame, path: Path) -> Path:
    """Probe: one bar per case and arm for a learner step, the head's share coloured."""
    rows = shares[np.isfinite(pd.to_numeric(shares["head_median_ms"], errors="coerce").to_numpy(dtype=float))]
    styles = arm_styles(list(dict.fromkeys(str(a) for a in shares["arm"])))
    with figure(path, width=10.0, height=max(3.0, 1.2 + 0.6 * len(rows))) as (fig, ax):
        for y, (_, row) in enumerate(rows.iterrows()):
            head, learner = float(row["head_median_ms"]), float(row["learner_ms"])
            ax.barh(y, min(head, learner), color=styles[str(row["arm"])].color, height=0.6, zorder=2)
            ax.barh(
                y, max(learner - head, 0.0), left=min(head, learner), color=REST_COLOR, height=0.6, zorder=2
            )
            share = f"  head {100 * float(row['head_share']):.2f}%"
            ax.text(learner, y, share, va="center", ha="left", fontsize=11)
        label_rows(ax, [f"{r['case']} · {r['arm']}" for _, r in rows.iterrows()])
        ax.set_xlim(0, (float(rows["learner_ms"].iloc[0]) if len(rows) else 1.0) * 1.3)
        ax.set_xlabel("milliseconds of one learner step")
        ax.set_title("probe: the head's share of one learner step")
        handles = [Patch(facecolor=s.color, label=f"head, {label}") for label, s in styles.items()]
        handles.append(Patch(facecolor=REST_COLOR, label="rest of the learner step"))
        legend_right(ax, handles=handles)
    return path
