"""The distributed screen (``bench screen --gpus N``): the optimizer-only step under a process group."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from experiments.ranks import barrier, gather_records, init_group, rank_device
from experiments.screen.trial import TrialSettings, WorkloadCache, make_arm_optimizer, window_figures
from harness.formatting import format_number, format_percent
from harness.isolation import run_in_ranks
from harness.present.model import markdown_table
from harness.schedule import Arm
from harness.timing import synchronize
from optimizers import distributed as sharing

if TYPE_CHECKING:  # the report's helpers below read pandas; a rank imports this module and needs none
    import pandas as pd

COLLECTIVES = ("all_gather_into_tensor", "all_reduce", "all_gather", "reduce_scatter_tensor", "broadcast")
RANK_HEADERS = ("scale", "arm", "ms/step (slowest rank)", "per rank", "collective ms", "collective share")
NO_FLOOR = "n/a: distributed screen (a step that holds a collective is not captured)"


@contextlib.contextmanager
def timed_collectives(device: str) -> Iterator[list[float]]:
    """Time every collective in the block; its seconds are appended to the list yielded."""
    seconds: list[float] = []

    def timed(function: Any) -> Any:
        def bracketed(*args: Any, **kwargs: Any) -> Any:
            synchronize(device)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                synchronize(device)
                seconds.append(time.perf_counter() - start)

        return bracketed

    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    gather = sharing._all_gather_single
    try:
        for name, function in originals.items():
            setattr(dist, name, timed(function))
        sharing._all_gather_single = timed(gather)
        yield seconds
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)
        sharing._all_gather_single = gather


def diagnostic_step(optimizer: Any, device: str) -> dict[str, Any]:
    """One synchronized step with its collectives bracketed: step ms, collective ms and their count."""
    with timed_collectives(device) as seconds:
        synchronize(device)
        start = time.perf_counter()
        optimizer.step()
        synchronize(device)
        step = time.perf_counter() - start
    collective = sum(seconds)
    return {
        "diagnostic_step_ms": step * 1e3,
        "collective_ms": collective * 1e3,
        "collectives": len(seconds),
        "collective_share": collective / step if step > 0 else None,
    }


RANK_TARGET = "experiments.screen.ranks:measure_in_rank"
TRIAL_TIMEOUT_S = 1800  # a hung collective fails its trial instead of the run


def trial_in_ranks(plan: Any) -> Any:
    """The distributed screen's trial function: each trial in ``plan.protocol.gpus`` fresh ranks."""

    def trial(ctx: Any) -> dict[str, Any]:
        logs = ctx.run_dir / "trials"
        logs.mkdir(exist_ok=True)
        payload = {
            "settings": {k: plan.settings[k] for k in ("steps", "warmup_steps", "floor_replays", "dtype")},
            "scale": ctx.case.params["scale"],
            "seed": ctx.seed,
            "arm": asdict(ctx.arm),
            "devices": list(plan.protocol.rank_devices),
        }
        return run_in_ranks(
            RANK_TARGET,
            payload,
            plan.protocol.gpus,
            timeout_s=TRIAL_TIMEOUT_S,
            log_path=logs / f"{ctx.trial.index}.log",
            placement=ctx.placement,
        )

    return trial


def measure_in_rank(payload: dict[str, Any]) -> dict[str, Any]:
    """One rank of a distributed screen trial; every rank returns the row (the parent keeps rank 0's)."""
    rank, _, device = rank_device(payload["devices"])
    settings = TrialSettings.of(payload["settings"])
    init_group(device)
    try:
        groups, kwargs = WorkloadCache().fresh(payload["scale"], int(payload["seed"]), settings.dtype, device)
        optimizer = make_arm_optimizer(Arm(**payload["arm"]), groups, kwargs)
        figures = window_figures(
            optimizer, device, settings, lambda: barrier(device), lambda: diagnostic_step(optimizer, device)
        )
        share = getattr(optimizer, "sharing", None) or {}
        records = gather_records({"rank": rank, **figures, "matrices_here": share.get("matrices_here")})
    finally:
        dist.destroy_process_group()
    return {**rank_row(records), **{f"sharing_{k}": share.get(k) for k in ("world", "matrices", "note")}}


def _max(values: list[Any]) -> Any:
    return None if any(v is None for v in values) else max(values)


def rank_row(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The trial's row from every rank's figures."""
    first = records[0]
    row = {k: v for k, v in first.items() if k not in ("rank", "matrices_here")}
    column = {key: [r[key] for r in records] for key in first}
    row.update(value=max(column["value"]), ranks=len(records), rank_ms=column["value"])
    row.update({f"rank_{k}": column[k] for k in ("host_ms", "collective_ms", "collective_share")})
    row.update({k: _max(column[k]) for k in ("diagnostic_step_ms", "collective_ms", "collective_share")})
    row["rank_matrices_here"] = column["matrices_here"]
    row.update({k: _max(column[k]) for k in ("extra_peak_bytes", "peak_allocated", "peak_reserved")})
    row.update(floor_ms=None, floor_note=NO_FLOOR, floor_replays=0)
    return row


def _rank_medians(rows: pd.DataFrame, column: str) -> list[float]:
    """Per rank, the median over trials of a per-rank list column."""
    import pandas as pd

    lists = [v for v in rows.get(column, pd.Series(dtype=object)) if isinstance(v, list)]
    if not lists:
        return []
    return [
        float(pd.Series([v[r] for v in lists if v[r] is not None]).median()) for r in range(len(lists[0]))
    ]


def ranks_lines(plan: Any, table: pd.DataFrame, trials: pd.DataFrame) -> list[str]:
    """The distributed screen's own table: each rank's step, the collective's share and the sharing."""
    import pandas as pd

    from harness.stats import finished  # pandas and the statistics: a rank needs neither

    ok = finished(trials)
    rows = []
    for _, r in table.iterrows():
        mine = ok[(ok["case"] == r["scale"]) & (ok["arm"] == r["arm"])] if not ok.empty else ok
        per_rank = " / ".join(format_number(ms) for ms in _rank_medians(mine, "rank_ms")) or "n/a"
        here = mine["rank_matrices_here"].iloc[-1] if "rank_matrices_here" in mine and len(mine) else None
        total = mine["sharing_matrices"].iloc[-1] if "sharing_matrices" in mine and len(mine) else None
        shared = (
            f"{' + '.join(str(int(h)) for h in here)} of {int(total)}"
            if isinstance(here, list) and None not in here and total is not None and not pd.isna(total)
            else "every rank: all"
        )
        ms, share = r["collective_ms_median"], r["collective_share_median"]
        ms, share = (
            f(v) if math.isfinite(v) else "n/a" for f, v in ((format_number, ms), (format_percent, share))
        )
        rows.append([r["scale"], r["arm"], format_number(r["ms_median"]), per_rank, ms, share, shared])
    ranks = plan.protocol.gpus
    return [
        f"#### Under a process group of {ranks} ranks ({plan.protocol.backend}: {', '.join(plan.protocol.rank_devices)})",
        "",
        "ms/step is the slowest rank's (a data-parallel step waits for it); each rank's median beside it. The "
        "collective's share: its milliseconds over one untimed diagnostic step's, each collective bracketed by "
        "synchronizations (so the diagnostic step is a little slower than a window's), the largest over ranks; "
        "a collective's time includes waiting in it for the other ranks. NS matrices per rank: "
        "the Newton-Schulz matrices each rank orthogonalizes, of all of them (`optimizer.sharing`); an arm "
        "without sharing does all of them on every rank.",
        "",
        markdown_table([*RANK_HEADERS, "NS matrices per rank"], rows, "llrrrrl"),
        "",
    ]
