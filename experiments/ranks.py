"""What every tier's ranks share: the process group of a data-parallel trial, its barrier and its gather."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from harness.isolation import launched_rank


def backend_of(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def rank_device(devices: list[str]) -> tuple[int, int, str]:
    """(rank, world size, this rank's device) of a rank of ``torch.distributed.run``, from its local rank."""
    ranked = launched_rank()
    if ranked is None:
        raise RuntimeError("this runs in a rank of torch.distributed.run (RANK and LOCAL_RANK are unset)")
    rank, local_rank = ranked
    return rank, int(os.environ["WORLD_SIZE"]), devices[local_rank]


def init_group(device: str) -> None:
    """The default process group from the launcher's environment, bound to this rank's device."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        dist.init_process_group("nccl", device_id=torch.device(device))
    else:
        dist.init_process_group("gloo")


def barrier(device: str) -> None:
    """A barrier of the default group; NCCL is told the rank's device so it does not guess one."""
    if device.startswith("cuda"):
        dist.barrier(device_ids=[torch.device(device).index or 0])
    else:
        dist.barrier()


def gather_records(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's record (each carries its ``rank``), in rank order, on every rank: one object all-gather."""
    records: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    return sorted(records, key=lambda r: r["rank"])
