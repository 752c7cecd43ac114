"""MuSGD in pure torch: the baseline `MuSGD` and the candidate `BatchedMuSGD` (docs/candidate.md)."""

from .batched import BatchedMuSGD
from .musgd import MuSGD
from .newton_schulz import muon_scale, newton_schulz

__all__ = ["BatchedMuSGD", "MuSGD", "muon_scale", "newton_schulz"]
