"""A step's core replayed from a CUDA graph where safe, else why not: a policy apart from the CUDA calls."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import torch

WARMUP_STEPS = 1  # eager cores run on the capture stream before a plan's capture

Compute = Callable[[], list[torch.Tensor]]
Recorded = tuple[Callable[[], None], list[torch.Tensor], int]  # replay, the outputs it refills, bytes kept


class Backend(Protocol):
    """What the policy needs from a device: select it, run on the capture stream, record a graph."""

    def on_device(self, device: torch.device) -> contextlib.AbstractContextManager[None]: ...
    def warm(self, device: torch.device, compute: Compute) -> tuple[list[torch.Tensor], int]: ...
    def record(self, device: torch.device, compute: Compute) -> Recorded: ...


# One side stream per device for the process: cuBLAS keeps a workspace per stream it ran on until exit.
_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


class CudaBackend:
    """CUDA streams and graphs: every warm-up and capture on the device's one side stream."""

    def _side(self, device: torch.device) -> torch.cuda.Stream:
        if device not in _SIDE_STREAMS:
            _SIDE_STREAMS[device] = torch.cuda.Stream(device)
        return _SIDE_STREAMS[device]

    def on_device(self, device: torch.device) -> contextlib.AbstractContextManager[None]:
        return torch.cuda.device(device)

    def warm(self, device: torch.device, compute: Compute) -> tuple[list[torch.Tensor], int]:
        """Run `compute` on the capture stream; its outputs and the bytes it kept (cuBLAS's workspace)."""
        current, side = torch.cuda.current_stream(device), self._side(device)
        before = torch.cuda.memory_allocated(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            outputs = compute()
        current.wait_stream(side)
        return outputs, max(0, torch.cuda.memory_allocated(device) - before)

    def record(self, device: torch.device, compute: Compute) -> Recorded:
        """Capture `compute` without running it."""
        current, side = torch.cuda.current_stream(device), self._side(device)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # as the capture itself does on entry, so the pool's growth can be read
        reserved = torch.cuda.memory_reserved(device)
        side.wait_stream(current)
        # The stream context restores the current stream even if capture_end raises.
        # "thread_local": other threads (a loader pinning memory) may keep calling CUDA meanwhile.
        try:
            with (
                torch.cuda.stream(side),
                torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"),
            ):
                outputs = compute()
        except Exception:
            torch.cuda.synchronize(device)
            raise
        current.wait_stream(side)
        return graph.replay, outputs, max(0, torch.cuda.memory_reserved(device) - reserved)


def _reason(exc: BaseException) -> str:
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first_line}"[:160]


class CoreGraph:
    """The captured core of one plan and its replays; `run` decides per step between replay and eager."""

    def __init__(self, backend: Backend | None = None) -> None:
        self.stats: Counter[str] = Counter()
        self.warm_bytes = 0  # the most a warm-up left allocated for good (its stream's cuBLAS workspace)
        self._backend: Backend = backend if backend is not None else CudaBackend()
        self.reset()

    def reset(self) -> None:
        """Drop the graph (its memory pool goes with it); the next plan starts with a warm-up."""
        self._key: object | None = None
        self._replay: Callable[[], None] | None = None
        self._outputs: list[torch.Tensor] = []
        self._failure: str | None = None
        self._warm_steps = 0
        self.pool_bytes = 0  # device memory the captured graph keeps reserved (its private pool)

    def run(
        self, key: object, device: torch.device | None, compute: Compute, refusal: str | None
    ) -> list[torch.Tensor]:
        """The core's outputs: replayed, captured, or eager; a new `key` (what the graph reads) drops it."""
        if refusal is not None:
            self.stats[f"eager: {refusal}"] += 1
            return compute()
        assert device is not None
        if key is not self._key:
            self.reset()
            self._key = key
        if self._failure is not None:
            self.stats["eager: capture failed earlier for this plan"] += 1
            return compute()
        with self._backend.on_device(device):
            if self._warm_steps < WARMUP_STEPS:
                self._warm_steps += 1
                self.stats["eager: warm-up"] += 1
                outputs, kept = self._backend.warm(device, compute)
                self.warm_bytes = max(self.warm_bytes, kept)
                return outputs
            if self._replay is None:
                try:
                    self._replay, self._outputs, self.pool_bytes = self._backend.record(device, compute)
                except Exception as exc:  # noqa: BLE001 - an uncapturable core runs eagerly, said so
                    self._failure = _reason(exc)
                    self.stats[f"eager: capture failed: {self._failure}"] += 1
                    return compute()
                self._replay()  # capture computes nothing: this step's core is the first replay
                self.stats["captured"] += 1
                return self._outputs
            self._replay()
            self.stats["replayed"] += 1
            return self._outputs
