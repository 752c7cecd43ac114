"""The fit tier's plot: where a whole fit's time goes, stage by stage (the ``--stages`` diagnostic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.patches import Patch

from harness.plots import figure, label_rows, legend_right

FIT_STAGE_COLORS = {
    "data": "#56B4E9",
    "forward_backward": "#0072B2",
    "optimizer": "#E69F00",
    "step_overhead": "#F0E442",
    "ema": "#009E73",
    "validation": "#CC79A7",
    "checkpoint": "#7F7F7F",
    "other": "#D9D9D9",
}


def plot_fit_stage_shares(table: pd.DataFrame, plan: Any, path: Path) -> Path:
    """Complete fit (``bench pair --stages``): a stacked bar of median stage seconds per arm."""
    arms = [a for a in plan.arm_labels() if a in set(table["arm"].astype(str))]
    stages = list(dict.fromkeys(str(s) for s in table["stage"]))
    height = max(3.0, 1.6 + 0.7 * len(arms))
    with figure(path, width=11.0, height=height) as (fig, ax):
        right = 0.0
        for y, arm in enumerate(arms):
            mine = table[table["arm"].astype(str) == arm].set_index("stage")
            left = 0.0
            for stage in stages:
                seconds = float(mine.loc[stage, "median_s"]) if stage in mine.index else 0.0
                color = FIT_STAGE_COLORS.get(stage, "#BBBBBB")
                ax.barh(
                    y,
                    seconds,
                    left=left,
                    color=color,
                    height=0.6,
                    edgecolor="#FFFFFF",
                    linewidth=0.8,
                    zorder=2,
                )
                left += seconds
            right = max(right, left)
            if "optimizer" in mine.index:
                share = f"  optimizer {100 * float(mine.loc['optimizer', 'share']):.1f}%"
                ax.text(left, y, share, va="center", ha="left", fontsize=11)
        ax.set_xlim(0, max(right, 1e-9) * 1.3)
        label_rows(ax, arms)
        ax.set_xlabel(f"median seconds of one whole fit ({plan.protocol.device})")
        ax.set_title(f"{plan.tier}: where the whole fit's time goes (synchronized stage marks)")
        handles = [
            Patch(facecolor=FIT_STAGE_COLORS.get(s, "#BBBBBB"), label=s.replace("_", " ")) for s in stages
        ]
        legend_right(ax, handles=handles)
    return path
