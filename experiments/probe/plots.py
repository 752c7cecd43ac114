"""The probe's plots: peak memory against the budget, and the head's share of one learner step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.plot_style import (
    ARM_COLORS,
    BAR,
    FAILED,
    MarkStyle,
    arm_styles,
    failure_handle,
    figure,
    label_rows,
    legend_right,
)


def plot_probe_memory(memory: pd.DataFrame, plan: Any, path: Path) -> Path:
    """Probe: median peak allocated per case and arm, the reserve hatched, the budget dashed."""
    styles = arm_styles(plan.arm_labels())
    gib = float(2**30)
    budget = plan.protocol.budget / gib if plan.protocol.budget is not None else None
    reserve = (plan.settings.get("reserve_bytes") or 0) / gib
    labels = [f"{r['case']} · {r['arm']}" for _, r in memory.iterrows()]
    height = max(3.2, 1.2 + 0.6 * len(labels))
    with figure(path, width=10.0, height=height) as (fig, ax):
        peaks = pd.to_numeric(memory["peak_allocated_max"], errors="coerce").to_numpy(dtype=float) / gib
        right = max([v for v in peaks if np.isfinite(v)] + [budget or 0.0, reserve, 1e-3]) * 1.12
        failed_any = False
        for y, (_, row) in enumerate(memory.iterrows()):
            style = styles.get(str(row["arm"]), MarkStyle(ARM_COLORS[0], "o"))
            median = float(pd.to_numeric(row["peak_allocated_median"], errors="coerce")) / gib
            top = float(pd.to_numeric(row["peak_allocated_max"], errors="coerce")) / gib
            if np.isfinite(median):
                ax.barh(y, median, color=style.color, height=0.6, zorder=2)
                if reserve:
                    ax.barh(
                        y,
                        min(reserve, median),
                        facecolor="none",
                        edgecolor="#FFFFFF",
                        hatch="//",
                        height=0.6,
                        linewidth=0,
                        zorder=3,
                    )
                if np.isfinite(top) and top > median:
                    ax.plot([median, top], [y, y], color="#000000", linewidth=1.5, zorder=4)
                    ax.plot([top, top], [y - 0.15, y + 0.15], color="#000000", linewidth=1.5, zorder=4)
            if int(row["out_of_memory"]):
                failed_any = True
                ax.scatter(
                    [budget if budget is not None else right / 1.12],
                    [y],
                    marker=FAILED.marker,
                    color=FAILED.color,
                    s=140,
                    linewidths=3,
                    zorder=5,
                    clip_on=False,
                )
        if budget is not None:
            ax.axvline(budget, color=BAR.color, linestyle="--", linewidth=2)
        ax.set_xlim(0, right)
        label_rows(ax, labels)
        ax.set_xlabel("peak allocated (GiB)")
        ax.set_title(f"{plan.tier}: peak memory of one head step")
        handles: list[Any] = [
            Patch(facecolor=s.color, label=f"{label} (median)") for label, s in styles.items()
        ]
        handles.append(Line2D([], [], color="#000000", linewidth=1.5, label="highest peak"))
        if reserve:
            handles.append(
                Patch(
                    facecolor="#999999", edgecolor="#FFFFFF", hatch="//", label="--reserve (rest of learner)"
                )
            )
        if budget is not None:
            handles.append(Line2D([], [], color=BAR.color, linestyle="--", linewidth=2, label="budget"))
        if failed_any:
            handles.append(failure_handle("out of memory"))
        legend_right(ax, handles=handles)
    return path


def plot_stage_share(shares: pd.DataFrame, path: Path) -> Path:
    """Probe: one bar per case and arm for a learner step, the head's share coloured."""
    rows = shares[np.isfinite(pd.to_numeric(shares["head_median_ms"], errors="coerce").to_numpy(dtype=float))]
    labels = list(dict.fromkeys(str(a) for a in shares["arm"]))
    styles = arm_styles(labels)
    height = max(3.0, 1.2 + 0.6 * len(rows))
    with figure(path, width=10.0, height=height) as (fig, ax):
        for y, (_, row) in enumerate(rows.iterrows()):
            head, learner = float(row["head_median_ms"]), float(row["learner_ms"])
            style = styles[str(row["arm"])]
            ax.barh(y, min(head, learner), color=style.color, height=0.6, zorder=2)
            ax.barh(
                y, max(learner - head, 0.0), left=min(head, learner), color="#D9D9D9", height=0.6, zorder=2
            )
            ax.text(
                learner,
                y,
                f"  head {100 * float(row['head_share']):.2f}%",
                va="center",
                ha="left",
                fontsize=11,
            )
        label_rows(ax, [f"{r['case']} · {r['arm']}" for _, r in rows.iterrows()])
        learner_ms = float(rows["learner_ms"].iloc[0]) if len(rows) else 1.0
        ax.set_xlim(0, learner_ms * 1.3)
        ax.set_xlabel("milliseconds of one learner step")
        ax.set_title("probe: the head's share of one learner step")
        handles = [Patch(facecolor=s.color, label=f"head, {label}") for label, s in styles.items()]
        handles.append(Patch(facecolor="#D9D9D9", label="rest of the learner step"))
        legend_right(ax, handles=handles)
    return path
