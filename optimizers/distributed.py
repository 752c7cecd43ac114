"""Sharing Newton-Schulz across the ranks of a process group: who orthogonalizes what, one gather per step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


def world_and_rank() -> tuple[int, int]:
    """The default process group's size and this process's rank; (1, 0) without an initialized group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(), dist.get_rank()


@dataclass(frozen=True)
class Partition:
    """Offsets, in elements, of every rank's share in one flat buffer of `world * per_rank` elements."""

    world: int
    rank: int
    per_rank: int
    chunks: tuple[int, ...]  # batch i puts chunks[i] matrices at offsets[i] of every rank's block
    offsets: tuple[int, ...]
    owners: tuple[int, ...]  # lone matrix j goes to rank owners[j], at whole_offsets[j] of its block
    whole_offsets: tuple[int, ...]

    @classmethod
    def of(
        cls, counts: list[int], sizes: list[int], whole_sizes: list[int], world: int, rank: int
    ) -> Partition:
        """Equal chunks of each batch per rank; lone matrices, largest first, to the least-loaded rank."""
        chunks = tuple(-(-count // world) for count in counts)
        offsets, position = [], 0
        for chunk, size in zip(chunks, sizes, strict=True):
            offsets.append(position)
            position += chunk * size
        loads = [position] * world
        owners, whole_offsets = [0] * len(whole_sizes), [0] * len(whole_sizes)
        for j in sorted(range(len(whole_sizes)), key=lambda j: (-whole_sizes[j], j)):
            owner = min(range(world), key=lambda r: (loads[r], r))
            owners[j], whole_offsets[j] = owner, loads[owner]
            loads[owner] += whole_sizes[j]
        return cls(world, rank, max(loads), chunks, tuple(offsets), tuple(owners), tuple(whole_offsets))

    def fingerprint(self) -> tuple[Any, ...]:
        """What every rank's partition must share (everything but the rank)."""
        return (self.world, self.per_rank, self.chunks, self.offsets, self.owners, self.whole_offsets)


def agreed(partition: Partition, description: tuple[Any, ...]) -> bool:
    """Whether every rank made the same partition of the same matrices (else each rank does all the work)."""
    mine = (partition.fingerprint(), description)
    everyone: list[Any] = [None] * partition.world
    dist.all_gather_object(everyone, mine)
    return all(other == mine for other in everyone)


_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather_shares(buffer: torch.Tensor, partition: Partition) -> None:
    """Fill every rank's block of `buffer` from that rank, in place; under gloo through a host copy."""
    start = partition.rank * partition.per_rank
    if buffer.device.type != "cpu" and dist.get_backend() == "gloo":
        staged = buffer.cpu()
        _all_gather_single(staged, staged[start : start + partition.per_rank])
        buffer.copy_(staged)
        return
    _all_gather_single(buffer, buffer[start : start + partition.per_rank])
