"""MuSGD implementations, pure torch: copy this folder into another project and it works there.

- `MuSGD`: the per-parameter baseline (Ultralytics 8.4.101 semantics, bit for bit).
- `BatchedMuSGD`: the candidate; batched Newton-Schulz and foreach momentum on CUDA, same state. Its layers:
  `newton_schulz` (the update, and its lockstep form over stacks), `batched` (the plan and the step),
  `concurrent` (stacks in lanes on forked streams), `graphs` (replaying the Newton-Schulz core from a CUDA
  graph), `distributed` (sharing it across ranks).
- `dispatch.count_dispatched_ops`: how many aten operations a call dispatches (the host work of a step).
"""

from .batched import BatchedMuSGD
from .musgd import MuSGD
from .newton_schulz import muon_scale, newton_schulz

__all__ = ["BatchedMuSGD", "MuSGD", "muon_scale", "newton_schulz"]
