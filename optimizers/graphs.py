"""Replaying a step's Newton-Schulz core from a CUDA graph, where that is safe, and saying why where not.

What is captured is the core only: the stacks filled from the momentum buffers or the plan's scratch (the
Nesterov inputs), the orthogonalized and scaled updates out, into the plan's scratch. It reads tensors whose
memory lasts as long as the plan, and no gradient, parameter or hyperparameter, so:

- a replay runs the eager core's kernels with the eager core's arguments: its bits are the eager step's by
  construction, whatever the learning rate or momentum does from step to step (the trainer's warm-up changes
  both every step), with no device-tensor scalars whose rounding would have to be proven equal to Python
  floats (a fused `p + alpha * u` with alpha as a kernel argument has no device-scalar twin in torch, and a
  0-dim tensor operand is rounded to a bf16 buffer's dtype);
- gradients need no static copies and may move between steps (the eager momentum reads them), a closure
  may run, parameters without gradients change the plan (and so the graph) rather than the graph's inputs;
- momentum, the Muon apply and the SGD part stay eager: a few foreach operations per group.

The graph is tied to one plan's fill (its stacks and inputs): a new plan is first run eagerly on the capture stream (lazy
per-stream set-up such as the cuBLAS workspace happens there, not inside the capture), captured on the next
step and replayed from then on. Wherever replay is refused the core runs eagerly and the reason is counted
(`CoreGraph.stats`): off, asked for, not on CUDA, on several devices, inside another capture (a caller
capturing the whole step, such as a launch-floor measurement, records the core's own kernels), warm-up, or a
capture that failed for this plan. The policy (`CoreGraph`) is kept apart from the CUDA mechanics
(`CudaBackend`: streams, capture, replay), so the policy can be exercised without a device.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import torch

WARMUP_STEPS = 1  # eager cores run on the capture stream before a plan's capture

Compute = Callable[[], list[torch.Tensor]]


class Backend(Protocol):
    """What the policy needs from a device: run on the capture stream, record a graph, select a device."""

    def on_device(self, device: torch.device) -> contextlib.AbstractContextManager[None]: ...

    def warm(self, device: torch.device, compute: Compute) -> tuple[list[torch.Tensor], int]:
        """Run `compute` where the capture will run: (its outputs, bytes it left allocated there)."""
        ...

    def record(
        self, device: torch.device, compute: Compute
    ) -> tuple[Callable[[], None], list[torch.Tensor], int]:
        """Capture `compute` without running it: (replay, the outputs a replay refills, bytes the graph keeps)."""
        ...


# One side stream per device for the whole process: cuBLAS keeps a workspace for every stream it has run on
# until the process ends, so a stream per optimizer would grow device memory with every optimizer built.
_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


class CudaBackend:
    """CUDA streams and graphs: one side stream per device, shared by every backend, for every warm-up and
    capture."""

    def _side(self, device: torch.device) -> torch.cuda.Stream:
        if device not in _SIDE_STREAMS:
            _SIDE_STREAMS[device] = torch.cuda.Stream(device)
        return _SIDE_STREAMS[device]

    def on_device(self, device: torch.device) -> contextlib.AbstractContextManager[None]:
        return torch.cuda.device(device)

    def warm(self, device: torch.device, compute: Compute) -> tuple[list[torch.Tensor], int]:
        """Run `compute` on the capture stream, ordered after and before the caller's stream's work.

        Memory it allocates there is used and freed by the caller's stream; every later use of the capture
        stream first waits for the caller's stream, so such memory is never reused while still read. What
        stays allocated afterwards (the core's outputs are the plan's own memory) is what the capture stream
        set up for good: cuBLAS's workspace for that stream, the first time the process uses it.
        """
        current, side = torch.cuda.current_stream(device), self._side(device)
        before = torch.cuda.memory_allocated(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            outputs = compute()
        current.wait_stream(side)
        return outputs, max(0, torch.cuda.memory_allocated(device) - before)

    def record(
        self, device: torch.device, compute: Compute
    ) -> tuple[Callable[[], None], list[torch.Tensor], int]:
        current, side = torch.cuda.current_stream(device), self._side(device)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # as the capture itself does on entry, so the pool's growth can be read
        reserved = torch.cuda.memory_reserved(device)
        side.wait_stream(current)
        # The outer stream context restores the current stream even if capture_end raises on exit.
        # "thread_local": other threads (a data loader pinning memory) may keep calling CUDA meanwhile.
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
        self.pool_bytes = 0  # device memory the captured graph keeps reserved (its private memory pool)
        # What a warm-up left allocated for good (the capture stream's cuBLAS workspace): the largest seen,
        # kept across plans, since the stream and its workspace outlive them.
        self.warm_bytes = 0
        self._backend: Backend = backend if backend is not None else CudaBackend()
        self._key: object | None = None
        self._replay: Callable[[], None] | None = None
        self._outputs: list[torch.Tensor] = []
        self._warm_steps = 0
        self._failure: str | None = None

    def reset(self) -> None:
        """Drop the graph (its memory pool goes with it); the next plan starts with a warm-up."""
        self._key, self._replay, self._outputs = None, None, []
        self._warm_steps, self._failure, self.pool_bytes = 0, None, 0

    def run(
        self, key: object, device: torch.device | None, compute: Compute, refusal: str | None
    ) -> list[torch.Tensor]:
        """The core's outputs for this step: replayed, captured then replayed, or computed eagerly.

        `key` identifies what the graph reads and writes, a plan's fill (a new key drops the old graph);
        `device` is the one CUDA device the core runs on; `refusal` is the caller's reason not to replay
        (None: replay is safe).
        """
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
                except Exception as exc:  # noqa: BLE001 - a core that cannot be captured runs eagerly, said so
                    self._failure = _reason(exc)
                    self.stats[f"eager: capture failed: {self._failure}"] += 1
                    return compute()
                self._replay()  # capture computes nothing: this step's core is the first replay
                self.stats["captured"] += 1
                return self._outputs
            self._replay()
            self.stats["replayed"] += 1
            return self._outputs
