"""Newton-Schulz chains of several stacks at once, bit for bit: each lane on its own forked CUDA stream."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from .newton_schulz import NS_STEPS, Stack, newton_schulz_stacks

# On the H200 (reports/h200-concurrent/logs/2026-12-04-0432/prices.log), 16 lanes were within 3% of the best
# floor at n, s, m and l, and 2.5% above 8 lanes at x.
DEFAULT_LANES = 16

_LANE_STREAMS: dict[torch.device, list[torch.cuda.Stream]] = {}


def newton_schulz_flops(small: int, large: int) -> int:
    """Floating-point operations of the quintic on one small×large matrix (X Xᵀ, A·A, B·X per step)."""
    return NS_STEPS * (4 * small * small * large + 2 * small**3)


def stack_flops(stack: Stack) -> int:
    """The quintic's arithmetic on a whole stack as it runs (padding included)."""
    rows, cols = stack.tensor.shape[-2:]
    count = stack.tensor.shape[0] if stack.tensor.ndim == 3 else 1
    return count * newton_schulz_flops(min(rows, cols), max(rows, cols))


def deal(costs: Sequence[float], lanes: int) -> list[list[int]]:
    """Indices dealt longest first to the least loaded of `lanes` lanes; each lane and the lanes in order."""
    if lanes < 1:
        raise ValueError(f"lanes must be at least 1, got {lanes!r}")
    loads = [(0.0, lane) for lane in range(min(lanes, len(costs)))]
    members: list[list[int]] = [[] for _ in loads]
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, lane = heapq.heappop(loads)
        members[lane].append(index)
        heapq.heappush(loads, (load + costs[index], lane))
    return sorted((sorted(lane) for lane in members if lane), key=lambda lane: lane[0])


def lane_streams(device: torch.device, count: int) -> list[torch.cuda.Stream]:
    """`count` side streams of `device`, the same ones every call (cuBLAS keeps a workspace per stream)."""
    streams = _LANE_STREAMS.setdefault(device, [])
    while len(streams) < count:
        streams.append(torch.cuda.Stream(device))
    return streams[:count]


def newton_schulz_lanes(stacks: Sequence[Stack], lanes: int) -> None:
    """`newton_schulz_stacks` of every stack on one device, up to `lanes` at once on CUDA."""
    if not stacks:
        return
    device = stacks[0].tensor.device
    if lanes <= 1 or len(stacks) == 1 or device.type != "cuda":
        newton_schulz_stacks(stacks)
        return
    dealt = deal([float(stack_flops(s)) for s in stacks], lanes)
    current = torch.cuda.current_stream(device)
    streams = lane_streams(device, len(dealt))
    for lane, stream in zip(dealt, streams, strict=True):
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            newton_schulz_stacks([stacks[i] for i in lane])
    for stream in streams:
        current.wait_stream(stream)
