"""The distributed screen (``bench screen --gpus N``): the optimizer-only step under a process group."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any
from unittest import mock

import torch.distributed as dist

from experiments.ranks import barrier, gather_records, init_group, rank_device
from experiments.screen.trial import WorkloadCache, make_arm_optimizer, trial_settings, window_figures
from harness.isolation import run_in_ranks
from harness.schedule import Arm
from harness.timing import synchronize
from optimizers import distributed as sharing

COLLECTIVES = ("all_gather_into_tensor", "all_reduce", "all_gather", "reduce_scatter_tensor", "broadcast")
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

    targets = [(dist, name) for name in COLLECTIVES if hasattr(dist, name)] + [
        (sharing, "_all_gather_single")
    ]
    with contextlib.ExitStack() as patches:
        for module, name in targets:
            patches.enter_context(mock.patch.object(module, name, timed(getattr(module, name))))
        yield seconds


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
            "settings": plan.settings,
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
    settings = trial_settings(payload["settings"])
    init_group(device)
    try:
        groups, kwargs = WorkloadCache().fresh(
            payload["scale"], int(payload["seed"]), settings.torch_dtype, device
        )
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
