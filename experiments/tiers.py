"""The project's tiers, registered in one place: how a run folder's ``plan.tier`` finds the code that reads it."""

from __future__ import annotations

from experiments import command, fit, parity, probe, screen
from harness.tier import TierRegistry

TIERS = TierRegistry([screen.TIER, probe.TIER, fit.PAIR, fit.STAGES, parity.TIER, command.TIER])
