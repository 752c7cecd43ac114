"""Newton-Schulz chains of several stacks at once: each lane of stacks on its own forked CUDA stream.

A stack's quintic is a chain of about 40 dependent kernels, most far too small to fill the GPU. Run one
stack after another (or in lockstep), the step's floor is the sum of the chains. Here the stacks are dealt
into lanes, each lane runs `newton_schulz_stacks` on a stream forked from the caller's, and the caller's
stream joins them all: the floor becomes about the longest lane. Inside a CUDA-graph capture the fork and
the join are graph edges, so a replay runs the lanes concurrently too.

The bits do not change. Each stack's kernels are the lockstep form's kernels with the same arguments: a
foreach operation over one tensor computes what it computes for that tensor in a longer list, and the
products are the same mm/bmm calls. Only their order across stacks changes, and no stack reads another.

Lanes are dealt by cost (longest first, each to the least-loaded lane), so the longest lane is short.
Streams are kept per device for the whole process, as the capture stream is: cuBLAS keeps a workspace for
every stream it has run on until the process ends.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from .newton_schulz import NS_STEPS, Stack, newton_schulz_stacks

# Chosen on the H200 (reports/h200-concurrent/logs/2026-12-04-0432/prices.log, lanes 1/4/8/16): 16 lanes gave
# the lowest or within 3% of the lowest floor at n, s, m and l, and 2.5% above 8 lanes at x.
DEFAULT_LANES = 16

_LANE_STREAMS: dict[torch.device, list[torch.cuda.Stream]] = {}


def newton_schulz_flops(small: int, large: int) -> int:
    """Floating-point operations of the quintic on one small×large matrix (X Xᵀ, A·A and B·X per iteration)."""
    return NS_STEPS * (4 * small * small * large + 2 * small**3)


def stack_flops(stack: Stack) -> int:
    """The quintic's arithmetic on a whole stack as it runs (padding included)."""
    rows, cols = stack.tensor.shape[-2:]
    count = stack.tensor.shape[0] if stack.tensor.ndim == 3 else 1
    return count * newton_schulz_flops(min(rows, cols), max(rows, cols))


def deal(costs: Sequence[float], lanes: int) -> list[list[int]]:
    """Indices dealt into at most `lanes` lanes, longest first to the least-loaded lane; each lane in the
    given order, lanes by first index, none empty. Ties go to the lowest lane, so the deal is deterministic."""
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
    """`count` side streams of `device`, the same ones every call (created once, kept for the process)."""
    streams = _LANE_STREAMS.setdefault(device, [])
    while len(streams) < count:
        streams.append(torch.cuda.Stream(device))
    return streams[:count]


def newton_schulz_lanes(stacks: Sequence[Stack], lanes: int) -> None:
    """`newton_schulz_stacks` of every stack, bit for bit, with up to `lanes` lanes running at once on CUDA.

    One lane, one stack or a non-CUDA device runs the lockstep form on the caller's stream. Every stack must
    be on one device. The caller's stream waits for every lane before it goes on, so what follows reads the
    results as it would after the lockstep form.
    """
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
