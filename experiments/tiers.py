"""The project's tiers, each with its ``bench`` command, registered in one place."""

from __future__ import annotations

from experiments import command, fit, parity, probe, screen
from harness.tier import TierRegistry

TIERS = TierRegistry(commands=[fit.COMMAND, screen.COMMAND, command.COMMAND, probe.COMMAND, parity.COMMAND])
