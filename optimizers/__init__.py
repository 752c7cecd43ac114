"""MuSGD implementations, pure torch: copy this folder into another project and it works there.

- `MuSGD`: the per-parameter baseline (Ultralytics 8.4.101 semantics, bit for bit).
- `BatchedMuSGD`: the candidate, batched on CUDA, same state (`batched`; `batched_on_cpu` runs it on CPU).
- Its layers: `newton_schulz` (the update, and its lockstep form), `concurrent` (stacks on forked streams),
  `graphs` (the core replayed from a CUDA graph), `distributed` (the core shared across ranks).
- `dispatch.count_dispatched_ops`: how many aten operations a call dispatches (the host work of a step).
"""

from .batched import BatchedMuSGD
from .musgd import MuSGD
from .newton_schulz import muon_scale, newton_schulz

__all__ = ["BatchedMuSGD", "MuSGD", "muon_scale", "newton_schulz"]
